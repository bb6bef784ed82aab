package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
	"github.com/outboxrelay/outboxrelay/sinks/sqs/sqstest"
)

func testConfig(srv *sqstest.Server, queueURL string) Config {
	return Config{QueueURL: queueURL, Common: awssink.Common{Connection: awssink.Connection{Region: sqstest.Region, Endpoint: srv.URL, AccessKeyID: "test", SecretAccessKey: "test", Timeout: 5 * time.Second}}}
}

func newSink(t testing.TB, cfg Config) *Sink {
	t.Helper()
	s, err := New(cfg, nil)
	return sinktest.Started(t, s, err)
}

// client is the bare SDK client the tests read back with.
func client(t testing.TB, srv *sqstest.Server) *sqs.Client {
	return sqs.New(sqs.Options{Region: sqstest.Region, BaseEndpoint: aws.String(srv.URL),
		Credentials: aws.AnonymousCredentials{}})
}

// consumer reads a queue as a consumer would: ReceiveMessage, then
// DeleteMessage, with the packed headers unpacked.
type consumer struct {
	c   *sqs.Client
	url string
	buf []sinktest.Received
	// lose, when set, is the server whose answer to one ReceiveMessage
	// with messages the consumer drops, as when the answer is lost on its
	// way: those messages stay in flight until their visibility timeout,
	// which the consumer lets pass on the server's clock once the queue
	// gives it nothing else, so they arrive behind later messages of
	// their aggregates. On a standard queue that is SQS's at-least-once
	// delivery in no promised order, which a real consumer meets on a
	// loaded machine, however well the sink kept order.
	lose    *sqstest.Server
	dropped bool
}

func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	for len(c.buf) == 0 {
		out, err := c.c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(c.url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			return sinktest.Received{}, err
		}
		if c.lose != nil {
			switch {
			case !c.dropped && len(out.Messages) > 0:
				c.dropped = true
				continue
			case c.dropped && len(out.Messages) == 0:
				c.lose.Advance(sqstest.VisibilityTimeout)
				c.lose = nil
				continue
			}
		}
		for _, m := range out.Messages {
			c.buf = append(c.buf, received(m))
			if _, err := c.c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(c.url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return sinktest.Received{}, err
			}
		}
	}
	r := c.buf[0]
	c.buf = c.buf[1:]
	return r, nil
}

func received(m types.Message) sinktest.Received {
	r := sinktest.Received{Headers: map[string]string{}, Body: []byte(aws.ToString(m.Body))}
	add := func(k, v string) {
		r.Headers[k] = v
		r.All = append(r.All, envelope.Header{Key: k, Value: v})
	}
	for k, a := range m.MessageAttributes {
		if k == awssink.PackedAttribute {
			var packed map[string]string
			if err := json.Unmarshal([]byte(aws.ToString(a.StringValue)), &packed); err == nil {
				for k, v := range packed {
					add(k, v)
				}
			}
			continue
		}
		add(k, aws.ToString(a.StringValue))
	}
	if r.All == nil {
		r.All = []envelope.Header{}
	}
	r.ID, r.Key = r.Headers["message_id"], r.Headers["aggregate_id"]
	r.Sequence = sqstest.Sequence(aws.ToString(m.MessageId))
	return r
}

type factory struct {
	srv    *sqstest.Server
	suffix string // .fifo or ""
}

func (f factory) NewSink(t *testing.T) relay.Sink {
	return newSink(t, testConfig(f.srv, f.srv.URL+"/"+sqstest.Account+"/{aggregate_type}"+f.suffix))
}

func (f factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	return &consumer{c: client(t, f.srv), url: f.srv.CreateQueue(aggregateType + f.suffix)}
}

// standard is the factory of standard queues, which SQS delivers in no
// promised order: each consumer loses the answer to one of its receives
// (consumer.lose), and the suite checks the order in which the server
// accepted each aggregate's messages (sinktest.Unordered).
type standard struct{ factory }

func (standard) Unordered() {}

func (f standard) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	return &consumer{c: client(t, f.srv), url: f.srv.CreateQueue(aggregateType), lose: f.srv}
}

func TestSuiteFIFO(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	sinktest.Run(t, factory{sqstest.Start(t), ".fifo"})
}

func TestSuiteStandard(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	sinktest.Run(t, standard{factory{sqstest.Start(t), ""}})
}

// publishRetrying publishes msgs as the relay does: one message of an
// aggregate at the sink at a time, each published again until it is
// delivered. It returns how many retryable failures there were.
func publishRetrying(ctx context.Context, t *testing.T, s *Sink, msgs []*relay.Message) int {
	t.Helper()
	var order []string
	byAgg := map[string][]*relay.Message{}
	for _, m := range msgs {
		if byAgg[m.AggregateID] == nil {
			order = append(order, m.AggregateID)
		}
		byAgg[m.AggregateID] = append(byAgg[m.AggregateID], m)
	}
	var retries atomic.Int64
	var wg sync.WaitGroup
	for _, agg := range order {
		wg.Go(func() {
			for _, m := range byAgg[agg] {
				for attempt := 0; ; attempt++ {
					out := make(chan error, 1)
					s.Publish(ctx, m, func(_ *relay.Message, err error) { out <- err })
					err := <-out
					if err == nil {
						break
					}
					if !relay.Retryable(err) || attempt > 50 {
						t.Errorf("message %s: %v", m.ID, err)
						return
					}
					retries.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(retries.Load())
}

// TestPartialBatchFailures: 30% of the entries and 10% of the requests
// fail; only the failed entries are sent again, and per-aggregate order
// (first arrival) holds with none lost.
func TestPartialBatchFailures(t *testing.T) {
	srv := sqstest.Start(t)
	url := srv.CreateQueue("partial.fifo")
	s := newSink(t, testConfig(srv, url))
	srv.SetFaults(sqstest.Faults{Entries: 0.3, Requests: 0.1})
	msgs := sinktest.Messages("partial", 2000, 40)
	ctx := t.Context()
	retries := publishRetrying(ctx, t, s, msgs)
	st := srv.Stats()
	got := sinktest.ReceiveAll(ctx, t, &consumer{c: client(t, srv), url: url}, msgs)
	sinktest.CheckOrder(t, msgs, got)
	t.Logf("%d messages, %d retries; server: %+v", len(msgs), retries, st)
	if st.FailedEntries < 300 || st.FailedRequests < 10 {
		t.Errorf("faults injected: %d entries, %d requests; want at least 300 and 10", st.FailedEntries, st.FailedRequests)
	}
	if st.Enqueued != len(msgs) {
		t.Errorf("%d enqueued for %d messages: a succeeded entry was sent again", st.Enqueued, len(msgs))
	}
}

// TestRefusedEntry: an entry SQS blames on the sender fails permanently
// with SQS's reason; the others of its batch are delivered.
func TestRefusedEntry(t *testing.T) {
	srv := sqstest.Start(t)
	url := srv.CreateQueue("refuse.fifo")
	srv.SetFaults(sqstest.Faults{Refuse: func(group string, _ map[string]string) string {
		if group == "bad" {
			return "aggregate bad is closed"
		}
		return ""
	}})
	s := newSink(t, Config{QueueURL: url, Common: awssink.Common{Connection: awssink.Connection{Region: sqstest.Region, Endpoint: srv.URL, AccessKeyID: "k", SecretAccessKey: "s"},
		// One worker that fills a batch of five: the five messages go in one
		// request however slowly the machine hands them over.
		BatchSize: 5, MaxConcurrentBatches: 1, Linger: time.Minute}})
	msgs := sinktest.Messages("refuse", 5, 5)
	msgs[2].AggregateID = "bad"
	rec := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, rec.Done)
	}
	out := rec.Wait(t, len(msgs), time.Minute)
	for i, m := range msgs {
		err := out[m]
		switch {
		case i == 2 && (err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), "InvalidParameterValue: aggregate bad is closed")):
			t.Errorf("refused message: %v, want permanent with the reason", err)
		case i != 2 && err != nil:
			t.Errorf("message %d: %v", i, err)
		}
	}
	if st := srv.Stats(); st.Requests != 1 {
		t.Errorf("%d requests, want the 5 messages in one batch", st.Requests)
	}
}

// TestAttributes: FIFO ids, and headers beyond 10 packed, none lost; a
// header that cannot name an attribute refused with the reason.
func TestAttributes(t *testing.T) {
	srv := sqstest.Start(t)
	url := srv.CreateQueue("attrs.fifo")
	s := newSink(t, testConfig(srv, url))
	m := sinktest.Messages("attrs", 1, 1)[0]
	m.AggregateID = "Zoë 42" // not a valid group id: hashed
	for i := range 8 {
		m.Headers = append(m.Headers, envelope.Header{Key: fmt.Sprintf("x-h%d", i), Value: fmt.Sprint(i)})
	}
	m.Headers = append(m.Headers, envelope.Header{Key: "empty", Value: ""})
	bad := sinktest.Messages("attrs", 1, 1)[0]
	bad.Headers = []envelope.Header{{Key: "x seq", Value: "1"}}
	rec := sinktest.NewRecorder()
	s.Publish(t.Context(), m, rec.Done)
	s.Publish(t.Context(), bad, rec.Done)
	out := rec.Wait(t, 2, time.Minute)
	if out[m] != nil {
		t.Fatal(out[m])
	}
	if err := out[bad]; err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), `header "x seq" cannot be a message attribute`) {
		t.Errorf("bad header: %v, want permanent naming it", err)
	}
	res, err := client(t, srv).ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MessageAttributeNames: []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(res.Messages))
	}
	got := res.Messages[0]
	if n := len(got.MessageAttributes); n != 10 {
		t.Errorf("%d attributes, want 10 (9 and the packed rest)", n)
	}
	r := received(got)
	for _, h := range m.Headers {
		if v, ok := r.Headers[h.Key]; !ok || v != h.Value {
			t.Errorf("header %s = %q (present %v), want %q", h.Key, v, ok, h.Value)
		}
	}
	if g := got.Attributes["MessageGroupId"]; g != awssink.GroupID(m.AggregateID) || !strings.HasPrefix(g, "sha256:") {
		t.Errorf("MessageGroupId %q", g)
	}
}

// TestDeduplication: a message sent again within SQS's five minutes is
// not enqueued twice; after them it is.
func TestDeduplication(t *testing.T) {
	srv := sqstest.Start(t)
	now := time.Now()
	var mu sync.Mutex
	srv.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	url := srv.CreateQueue("dedup.fifo")
	s := newSink(t, testConfig(srv, url))
	m := sinktest.Messages("dedup", 1, 1)[0]
	for i, advance := range []time.Duration{0, time.Minute, sqstest.DedupInterval} {
		mu.Lock()
		now = now.Add(advance)
		mu.Unlock()
		rec := sinktest.NewRecorder()
		s.Publish(t.Context(), m, rec.Done)
		if err := rec.Wait(t, 1, time.Minute)[m]; err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if st := srv.Stats(); st.Enqueued != 2 || st.Dedups != 1 {
		t.Errorf("enqueued %d, deduplicated %d; want 2 and 1", st.Enqueued, st.Dedups)
	}
}

// TestConnect: a missing queue and an unreachable endpoint are one clear
// error at start.
func TestConnect(t *testing.T) {
	srv := sqstest.Start(t)
	s, err := New(testConfig(srv, srv.URL+"/"+sqstest.Account+"/missing.fifo"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Connect(t.Context())
	var missing *types.QueueDoesNotExist
	if err == nil || !errors.As(err, &missing) || !strings.Contains(err.Error(), "cannot reach the SQS queue") {
		t.Errorf("missing queue: %v", err)
	}
	cfg := testConfig(srv, "http://127.0.0.1:1/"+sqstest.Account+"/q")
	cfg.Endpoint = "http://127.0.0.1:1"
	s2, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Connect(t.Context()); err == nil || !strings.Contains(err.Error(), "check sink.sqs.queue_url, region, endpoint") {
		t.Errorf("unreachable: %v", err)
	}
}

func TestValidate(t *testing.T) {
	err := Config{QueueURL: "https://sqs.example/1/{aggregate_type}/q", Common: awssink.Common{BatchSize: 11, Connection: awssink.Connection{AccessKeyID: "k"}}}.Validate()
	for _, want := range []string{"sink.sqs.queue_url", "placeholder outside the queue name", "sink.sqs.batch_size is 11", "sink.sqs.access_key_id is set without sink.sqs.secret_access_key"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
}
