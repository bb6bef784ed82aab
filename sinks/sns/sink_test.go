package sns

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
	"github.com/outboxrelay/outboxrelay/sinks/sns/goawstest"
)

func testConfig(srv *goawstest.Server, arn string) Config {
	// goaws has no PublishBatch: a batch size of 1 publishes with Publish.
	return Config{TopicARN: arn, Common: awssink.Common{Connection: awssink.Connection{Region: goawstest.Region, Endpoint: srv.URL, AccessKeyID: "test", SecretAccessKey: "test", Timeout: 5 * time.Second}, BatchSize: 1}}
}

func newSink(t testing.TB, cfg Config) *Sink {
	t.Helper()
	s, err := New(cfg, nil)
	return sinktest.Started(t, s, err)
}

// consumer reads the queue subscribed to a topic, with raw delivery, as a
// subscriber would, the packed headers unpacked.
type consumer struct {
	srv *goawstest.Server
	url string
	buf []sinktest.Received
}

func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	for len(c.buf) == 0 {
		if err := ctx.Err(); err != nil {
			return sinktest.Received{}, err
		}
		ms, err := c.srv.Receive(c.url)
		if err != nil {
			return sinktest.Received{}, err
		}
		if len(ms) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		for _, m := range ms {
			c.buf = append(c.buf, received(m))
		}
	}
	r := c.buf[0]
	c.buf = c.buf[1:]
	return r, nil
}

func received(m goawstest.Message) sinktest.Received {
	r := sinktest.Received{Headers: map[string]string{}, Body: []byte(m.Body), All: []envelope.Header{}}
	add := func(k, v string) {
		r.Headers[k] = v
		r.All = append(r.All, envelope.Header{Key: k, Value: v})
	}
	for k, v := range m.Attributes {
		if k == awssink.PackedAttribute {
			var packed map[string]string
			if err := json.Unmarshal([]byte(v), &packed); err == nil {
				for k, v := range packed {
					add(k, v)
				}
			}
			continue
		}
		add(k, v)
	}
	r.ID, r.Key = r.Headers["message_id"], r.Headers["aggregate_id"]
	return r
}

type factory struct{ srv *goawstest.Server }

func (f factory) NewSink(t *testing.T) relay.Sink {
	return newSink(t, testConfig(f.srv, goawstest.TopicARN("{aggregate_type}")))
}

func (f factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	return &consumer{srv: f.srv, url: f.srv.Subscribe(t, aggregateType)}
}

func TestSuite(t *testing.T) {
	sinktest.Run(t, factory{goawstest.Start(t)})
}

// TestRefused: a message above max_message_bytes and a header SNS cannot
// carry are permanent failures naming the reason; the next message of
// the aggregate is delivered.
func TestRefused(t *testing.T) {
	srv := goawstest.Start(t)
	q := srv.Subscribe(t, "refused")
	cfg := testConfig(srv, goawstest.TopicARN("refused"))
	cfg.MaxMessageBytes = 2048
	s := newSink(t, cfg)
	msgs := sinktest.Messages("refused", 3, 1)
	msgs[0].Envelope = []byte(`{"payload":"` + strings.Repeat("x", 3000) + `"}`)
	msgs[1].Headers = []envelope.Header{{Key: "AWS.trace", Value: "1"}}
	rec := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, rec.Done)
	}
	out := rec.Wait(t, 3, time.Minute)
	for i, want := range []string{"above sink.sns.max_message_bytes (2048)", `header "AWS.trace" cannot be a message attribute: AWS reserves`} {
		if err := out[msgs[i]]; err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("message %d: %v, want permanent with %q", i, err, want)
		}
	}
	if out[msgs[2]] != nil {
		t.Fatal(out[msgs[2]])
	}
	got := sinktest.ReceiveAll(t.Context(), t, &consumer{srv: srv, url: q}, msgs[2:])
	if len(got) != 1 || got[0].ID != msgs[2].ID {
		t.Errorf("received %v", got)
	}
}

func TestValidate(t *testing.T) {
	err := Config{TopicARN: "arn:aws:sns:{aggregate_type}:1:t", Common: awssink.Common{BatchSize: 11}}.Validate()
	for _, want := range []string{"sink.sns.topic_arn", "placeholder outside the topic name", "sink.sns.batch_size is 11"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
}

// TestConnectUnreachable: no answer at all is an error, not an emulator's
// odd answer.
func TestConnectUnreachable(t *testing.T) {
	s, err := New(Config{TopicARN: "arn:aws:sns:us-east-1:000000000000:t", Common: awssink.Common{Connection: awssink.Connection{Region: "us-east-1", Endpoint: "http://127.0.0.1:1", AccessKeyID: "k", SecretAccessKey: "s"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Connect(t.Context()); err == nil || !strings.Contains(err.Error(), "cannot reach the SNS topic") {
		t.Errorf("Connect: %v, want cannot reach", err)
	}
}
