package pubsub

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

const project = "outboxrelay-test"

// fixture is a pstest server on loopback TCP, reached as the relay reaches
// the emulator: through PUBSUB_EMULATOR_HOST.
type fixture struct {
	srv    *pstest.Server
	client *pubsub.Client
}

func newFixture(t testing.TB, opts ...pstest.ServerReactorOption) *fixture {
	t.Helper()
	srv := pstest.NewServerWithPort(0, opts...)
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	client, err := pubsub.NewClient(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.Close()
		srv.Close()
	})
	return &fixture{srv: srv, client: client}
}

func (f *fixture) createTopic(t testing.TB, id string) {
	t.Helper()
	if _, err := f.client.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topicName(id)}); err != nil {
		t.Fatal(err)
	}
}

func topicName(id string) string { return "projects/" + project + "/topics/" + id }

func startSink(tb testing.TB, cfg Config) *Sink {
	tb.Helper()
	s, err := New(cfg, zaptest.NewLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Connect(ctx); err != nil {
		s.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

type factory struct{ f *fixture }

func (fa factory) NewSink(t *testing.T) relay.Sink {
	return startSink(t, Config{Project: project, Topic: "{aggregate_type}", Timeout: 5 * time.Second})
}

func (fa factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	fa.f.createTopic(t, aggregateType)
	return &consumer{srv: fa.f.srv, topic: topicName(aggregateType)}
}

// consumer reads what pstest holds for one topic, in the order the server
// accepted it.
type consumer struct {
	srv     *pstest.Server
	topic   string
	next    int // index into srv.Messages()
	pending []*pstest.Message
}

func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	for len(c.pending) == 0 {
		all := c.srv.Messages()
		for _, m := range all[c.next:] {
			if m.Topic == c.topic {
				c.pending = append(c.pending, m)
			}
		}
		c.next = len(all)
		if len(c.pending) == 0 {
			select {
			case <-ctx.Done():
				return sinktest.Received{}, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	m := c.pending[0]
	c.pending = c.pending[1:]
	return received(m), nil
}

func received(m *pstest.Message) sinktest.Received {
	r := sinktest.Received{ID: m.Attributes["message_id"], Key: m.OrderingKey, Headers: m.Attributes, Body: m.Data}
	for k, v := range m.Attributes {
		r.All = append(r.All, envelope.Header{Key: k, Value: v})
	}
	return r
}

func TestSuite(t *testing.T) {
	sinktest.Run(t, factory{newFixture(t)})
}

// flaky fails the Publish calls it is told to with FailedPrecondition, a
// code the client does not retry, so that the failure reaches the sink.
type flaky struct {
	fail  atomic.Int64 // how many of the next calls fail
	calls atomic.Int64
}

func (r *flaky) React(any) (bool, any, error) {
	r.calls.Add(1)
	if r.fail.Add(-1) >= 0 {
		return true, nil, status.Error(codes.FailedPrecondition, "injected failure")
	}
	return false, nil, nil
}

// TestResumeAfterFailure: a failed publish pauses the aggregate's ordering
// key in the client; the sink resumes it for the message's retry, and the
// messages behind the failure fail with it rather than overtake it.
func TestResumeAfterFailure(t *testing.T) {
	r := &flaky{}
	f := newFixture(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: r})
	f.createTopic(t, "orders")
	s := startSink(t, Config{Project: project, Topic: "orders", Timeout: 5 * time.Second})
	c := &consumer{srv: f.srv, topic: topicName("orders")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	msgs := sinktest.Messages("orders", 3, 1)
	r.fail.Store(1)
	tr := sinktest.NewTracker(msgs[:1])
	s.Publish(ctx, msgs[0], tr.Done)
	tr.Wait(ctx, t)
	if err := tr.Err(0); err == nil || !relay.Retryable(err) {
		t.Fatalf("publish against an injected failure: %v, want a retryable error", err)
	}
	// The relay's retry of the failed message, then the ones behind it.
	sinktest.PublishAll(ctx, t, s, msgs)
	got := sinktest.ReceiveAll(ctx, t, c, msgs)
	sinktest.CheckOrder(t, msgs, got)
}

// TestFailureFailsTheOnesBehind: messages of the aggregate queued behind a
// failed one are failed too, never published ahead of its retry.
func TestFailureFailsTheOnesBehind(t *testing.T) {
	r := &flaky{}
	f := newFixture(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: r})
	f.createTopic(t, "orders")
	s := startSink(t, Config{Project: project, Topic: "orders", Timeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	msgs := sinktest.Messages("orders", 50, 1)
	r.fail.Store(1)
	tr := sinktest.NewTracker(msgs)
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	tr.Wait(ctx, t)
	failed := false
	for i := range msgs {
		err := tr.Err(i)
		if err != nil && !relay.Retryable(err) {
			t.Errorf("message %d: permanent %v", i, err)
		}
		if failed && err == nil {
			t.Fatalf("message %d was published after message of its aggregate before it failed", i)
		}
		failed = failed || err != nil
	}
	if !failed {
		t.Fatal("no message failed: the injected failure was not exercised")
	}
}

func TestBadMessages(t *testing.T) {
	f := newFixture(t)
	f.createTopic(t, "orders")
	s := startSink(t, Config{Project: project, Topic: "{aggregate_type}", Timeout: 5 * time.Second})
	ctx := context.Background()
	for _, c := range []struct {
		name string
		edit func(m *relay.Message)
		want string
	}{
		{"goog attribute", func(m *relay.Message) { m.Headers = []envelope.Header{{Key: "googfoo", Value: "x"}} }, "starts with goog"},
		{"long value", func(m *relay.Message) {
			m.Headers = []envelope.Header{{Key: "big", Value: strings.Repeat("v", 1025)}}
		}, "header big has 1025 bytes"},
		{"repeated header", func(m *relay.Message) {
			m.Headers = []envelope.Header{{Key: "tenant", Value: "a"}, {Key: "tenant", Value: "b"}}
		}, "header tenant appears twice"},
		{"long ordering key", func(m *relay.Message) { m.AggregateID = strings.Repeat("k", 1025) }, "aggregate_id has 1025 bytes"},
		{"bad topic", func(m *relay.Message) { m.AggregateType = "or ders" }, `pubsub topic id "or ders" has ' '`},
		{"too large", func(m *relay.Message) { m.Envelope = make([]byte, maxMessageBytes) }, "Pub/Sub takes at most 10000000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := sinktest.Messages("orders", 1, 1)[0]
			c.edit(m)
			tr := sinktest.NewTracker([]*relay.Message{m})
			s.Publish(ctx, m, tr.Done)
			tr.Wait(ctx, t)
			if err := tr.Err(0); err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v, want a permanent error with %q", err, c.want)
			}
		})
	}
}

func TestConnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	t.Run("unreachable", func(t *testing.T) {
		t.Setenv("PUBSUB_EMULATOR_HOST", closed)
		s, err := New(Config{Project: project, Topic: "orders", Timeout: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sinktest.CheckUnreachable(t, s, "no-secret", "cannot reach pubsub", "sink.pubsub.endpoint")
	})
	t.Run("missing topic", func(t *testing.T) {
		newFixture(t)
		s, err := New(Config{Project: project, Topic: "absent", Timeout: 5 * time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sinktest.CheckUnreachable(t, s, "no-secret", "projects/outboxrelay-test/topics/absent does not exist", "sink.pubsub.topic")
	})
	t.Run("missing credentials", func(t *testing.T) {
		t.Setenv("PUBSUB_EMULATOR_HOST", "")
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
		t.Setenv("HOME", t.TempDir()) // no gcloud application default credentials
		s, err := New(Config{Project: project, Topic: "orders", Timeout: 5 * time.Second}, nil)
		if err == nil {
			err = s.Connect(context.Background())
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "set sink.pubsub.credentials_file") {
			t.Errorf("New without credentials: %v, want an error naming sink.pubsub.credentials_file", err)
		}
	})
}

func TestValidate(t *testing.T) {
	err := Config{Topic: "{aggregatetype}", CredentialsFile: "/nonexistent/key.json", MaxInFlight: -1}.Validate()
	for _, want := range []string{
		"sink.pubsub.project is empty",
		"sink.pubsub.topic: topic template",
		"unknown placeholder {aggregatetype}",
		"sink.pubsub.credentials_file: stat /nonexistent/key.json",
		"sink.pubsub.max_inflight is -1",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
	for _, topic := range []string{"goog-orders", "1orders", "ab"} {
		if err := (Config{Project: project, Topic: topic}).Validate(); err == nil {
			t.Errorf("topic %q: valid, want an error", topic)
		}
	}
}
