package kafka

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSuite(t *testing.T) {
	sinktest.Run(t, factory{c: newCluster(t)})
}

func TestRecord(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{Topic: "evt.{aggregate_type}.{event_type}"})
	cons := newConsumer(t, c, "evt.order.order_created")

	m := &relay.Message{
		ID:            "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a",
		AggregateType: "order",
		AggregateID:   "42",
		EventType:     "order_created",
		Table:         "public.outbox",
		Traceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Headers:       []envelope.Header{{Key: "tenant", Value: "acme"}, {Key: "priority", Value: "1"}},
		Envelope:      []byte(`{"envelope_version":1,"message_id":"0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a"}`),
	}
	// No traceparent, empty aggregate id.
	m2 := &relay.Message{
		ID:            "0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5b",
		AggregateType: "order",
		EventType:     "order_created",
		Envelope:      []byte(`{}`),
	}
	for _, m := range []*relay.Message{m, m2} {
		if err := publishOne(t, s, m); err != nil {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
		if m.Destination != "evt.order.order_created" {
			t.Errorf("Destination = %q, want evt.order.order_created", m.Destination)
		}
	}

	// The two keys hash to different partitions, whose records a fetch
	// returns in either order: take m's record first.
	rs := cons.records(t, 2)
	if len(rs[1].Headers) > 0 && string(rs[1].Headers[0].Value) == m.ID {
		rs[0], rs[1] = rs[1], rs[0]
	}
	r := rs[0]
	if string(r.Key) != "42" || string(r.Value) != string(m.Envelope) {
		t.Errorf("key %q value %q, want 42 and the envelope", r.Key, r.Value)
	}
	want := []string{
		"message_id=" + m.ID,
		"event_type=order_created",
		"traceparent=" + m.Traceparent,
		"content-type=application/json",
		"tenant=acme",
		"priority=1",
	}
	if got := headerList(r); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("headers\n got %q\nwant %q", got, want)
	}

	r = rs[1]
	if r.Key == nil || len(r.Key) != 0 {
		t.Errorf("key of an empty aggregate_id = %#v, want empty and not null", r.Key)
	}
	want = []string{"message_id=" + m2.ID, "event_type=order_created", "content-type=application/json"}
	if got := headerList(r); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("headers without traceparent\n got %q\nwant %q", got, want)
	}
}

func headerList(r *kgo.Record) []string {
	var hs []string
	for _, h := range r.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	return hs
}

// TestOrderPerKey checks per-key order over 8 partitions, with every key on
// one partition.
func TestOrderPerKey(t *testing.T) {
	const n, keys = 5000, 100
	c := newCluster(t, kfake.SeedTopics(8, "outbox.order"))
	s := newSink(t, c, Config{})
	cons := newConsumer(t, c, "outbox.order")

	msgs := sinktest.Messages("order", n, keys)
	tr := sinktest.NewTracker(msgs)
	ctx := t.Context()
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)

	pos := map[string]int{}
	for i, m := range msgs {
		pos[m.ID] = i
	}
	last := map[string]int{}
	part := map[string]int32{}
	parts := map[int32]bool{}
	for _, r := range cons.records(t, n) {
		k, id := string(r.Key), header(r, HeaderMessageID)
		if p, ok := part[k]; ok && p != r.Partition {
			t.Errorf("key %s on partitions %d and %d", k, p, r.Partition)
		}
		part[k] = r.Partition
		parts[r.Partition] = true
		if prev, ok := last[k]; ok && prev >= pos[id] {
			t.Fatalf("key %s: message #%d after #%d", k, pos[id], prev)
		}
		last[k] = pos[id]
	}
	if len(parts) != 8 {
		t.Errorf("records on %d partitions, want 8", len(parts))
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestInvalidTopic(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{Topic: "{aggregate_type}"})
	produces := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
	defer produces.Remove()

	for _, at := range []string{"", ".", "..", "order/eu", "ordér", "a b", strings.Repeat("x", 250),
		"caf\xe9", DefaultPositionsTopic, "__consumer_offsets", "__transaction_state", "_schemas"} {
		m := &relay.Message{ID: "id-" + at, AggregateType: at, AggregateID: "1", Envelope: []byte("{}")}
		err := publishOne(t, s, m)
		if !isPermanent(err) {
			t.Errorf("aggregate_type %q: err %v, want permanent", at, err)
		}
		if m.Destination != at {
			t.Errorf("aggregate_type %q: Destination %q, want the rendered topic", at, m.Destination)
		}
	}
	if n := produces.Hits(); n != 0 {
		t.Errorf("%d produce requests for invalid topics, want 0", n)
	}

	ok := &relay.Message{ID: "ok", AggregateType: strings.Repeat("x", 249), AggregateID: "1", Envelope: []byte("{}")}
	if err := publishOne(t, s, ok); err != nil {
		t.Fatalf("valid topic after invalid ones: %v", err)
	}
	if produces.Hits() == 0 {
		t.Error("no produce request for a valid topic")
	}
}

// TestInvalidUTF8KeyOrHeader: a record whose key (aggregate_id) or a header
// (event_type, a row header) is not valid UTF-8 fails permanently, naming
// it, and is never produced: its envelope would carry U+FFFD where the key
// or header carries the raw bytes.
func TestInvalidUTF8KeyOrHeader(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{Topic: "outbox.{aggregate_type}"})
	produces := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
	defer produces.Remove()
	for _, tc := range []struct {
		m    relay.Message
		want string
	}{
		{relay.Message{AggregateID: "caf\xe9"}, `kafka record key (aggregate_id) "caf\xe9" is not valid UTF-8`},
		{relay.Message{AggregateID: "1", EventType: "order.cr\xe9ated"}, `header "event_type" value "order.cr\xe9ated" is not valid UTF-8`},
		{relay.Message{AggregateID: "1", Headers: []envelope.Header{{Key: "t\xff", Value: "x"}}}, `header name "t\xff" is not valid UTF-8`},
	} {
		m := tc.m
		m.ID, m.AggregateType, m.Envelope = "m", "order", []byte("{}")
		err := publishOne(t, s, &m)
		if !isPermanent(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want a permanent error containing %s", tc.m, err, tc.want)
		}
	}
	if n := produces.Hits(); n != 0 {
		t.Errorf("%d produce requests for invalid records, want 0", n)
	}
}

func TestMessageTooLarge(t *testing.T) {
	big := func(id string, n int) *relay.Message {
		// Random bytes: the broker limits the compressed batch.
		b := make([]byte, n)
		rand.Read(b)
		return &relay.Message{ID: id, AggregateType: "order", AggregateID: "1", Envelope: b}
	}
	small := func(id string) *relay.Message {
		return &relay.Message{ID: id, AggregateType: "order", AggregateID: "1", Envelope: []byte("{}")}
	}

	t.Run("client", func(t *testing.T) {
		c := newCluster(t)
		s := newSink(t, c, Config{MaxMessageBytes: 10_000})
		err := publishOne(t, s, big("big", 20_000))
		if !isPermanent(err) || !errors.Is(err, kerr.MessageTooLarge) {
			t.Errorf("err %v, want permanent MESSAGE_TOO_LARGE", err)
		}
		if err := publishOne(t, s, small("small")); err != nil {
			t.Errorf("small record after a large one: %v", err)
		}
	})

	t.Run("broker", func(t *testing.T) {
		c := newCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "10000"}))
		s := newSink(t, c, Config{})
		err := publishOne(t, s, big("big", 20_000))
		if !isPermanent(err) || !errors.Is(err, kerr.MessageTooLarge) {
			t.Errorf("err %v, want permanent MESSAGE_TOO_LARGE", err)
		}
		if err := publishOne(t, s, small("small")); err != nil {
			t.Errorf("small record after a large one: %v", err)
		}
	})
}

// TestBrokerFaults fails produce requests for a while in the ways a broker
// outage does; every record must be acknowledged once, in order per key, and
// stored once.
func TestBrokerFaults(t *testing.T) {
	const n, keys = 2000, 20
	for _, tc := range []struct {
		name   string
		inject func(c *kfake.Cluster) (stop func())
	}{
		{"NotLeader", func(c *kfake.Cluster) func() {
			h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1})
			return h.Remove
		}},
		{"ConnectionCut", func(c *kfake.Cluster) func() {
			var mu sync.Mutex
			cut := true
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				mu.Lock()
				defer mu.Unlock()
				if !cut {
					return nil, nil, false
				}
				c.KeepControl()
				return nil, errors.New("connection cut"), true
			})
			return func() { mu.Lock(); cut = false; mu.Unlock() }
		}},
		{"TimeoutAfterWrite", func(c *kfake.Cluster) func() {
			// REQUEST_TIMED_OUT is answered after the records are
			// written: the retry must be deduplicated.
			h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: 5})
			return h.Remove
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, kfake.SeedTopics(4, "outbox.order"))
			s := newSink(t, c, Config{})
			cons := newConsumer(t, c, "outbox.order")
			seen := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
			defer seen.Remove()

			stop := tc.inject(c)
			msgs := sinktest.Messages("order", n, keys)
			tr := sinktest.NewTracker(msgs)
			ctx := t.Context()
			for _, m := range msgs[:n/2] {
				s.Publish(ctx, m, tr.Done)
			}
			time.Sleep(300 * time.Millisecond) // let the producer retry a few times
			for _, m := range msgs[n/2:] {
				s.Publish(ctx, m, tr.Done)
			}
			time.Sleep(200 * time.Millisecond)
			stop()
			tr.Wait(ctx, t)
			tr.CheckAllAcked(t)

			checkStoredOnceInOrder(ctx, t, cons, msgs)
		})
	}
}

// TestBrokerRestart stops the only broker and starts a new one on the same
// port: Ready follows, and a record published meanwhile is delivered.
func TestBrokerRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	c1, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, c1, Config{DialTimeout: time.Second})
	if !s.Ready() {
		t.Fatal("not ready after Ping")
	}
	if err := publishOne(t, s, &relay.Message{ID: "before", AggregateType: "order", AggregateID: "1", Envelope: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	c1.Close()

	// The relay's part: republish on retryable errors until acknowledged.
	during := &relay.Message{ID: "during", AggregateType: "order", AggregateID: "1", Envelope: []byte("{}")}
	acked := make(chan error, 1)
	go func() {
		for {
			ch := make(chan error, 1)
			s.Publish(t.Context(), during, func(_ *relay.Message, err error) { ch <- err })
			err := <-ch
			if err == nil || !relay.Retryable(err) {
				acked <- err
				return
			}
			t.Logf("retrying after: %v", err)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	waitFor(t, "not ready while the broker is down", func() bool { return !s.Ready() })
	select {
	case err := <-acked:
		t.Fatalf("record reported with the broker down: %v", err)
	default:
	}

	c2, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("record published during the outage: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("record published during the outage not acknowledged after the restart")
	}
	waitFor(t, "ready after the restart", s.Ready)
	r := newConsumer(t, c2, "outbox.order").records(t, 1)[0]
	if id := header(r, HeaderMessageID); id != "during" {
		t.Errorf("got message %q, want during", id)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPingUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	s, err := New(Config{Brokers: []string{addr}, DialTimeout: 500 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = s.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Ping: %v, want an error naming %s", err, addr)
	}
	if s.Ready() {
		t.Error("Ready with no broker reachable")
	}
}

func TestPublishAfterClose(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{})
	s.Close()
	err := publishOne(t, s, &relay.Message{ID: "late", AggregateType: "order", AggregateID: "1", Envelope: []byte("{}")})
	if err == nil || !relay.Retryable(err) || !errors.Is(err, kgo.ErrClientClosed) {
		t.Errorf("publish after Close: %v, want retryable ErrClientClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestCloseLeaksNothing publishes, closes everything and checks no goroutine
// is left behind.
func TestCloseLeaksNothing(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Brokers: c.ListenAddrs()}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	msgs := sinktest.Messages("order", 500, 10)
	tr := sinktest.NewTracker(msgs)
	for _, m := range msgs {
		s.Publish(t.Context(), m, tr.Done)
	}
	tr.Wait(t.Context(), t)
	s.Close()
	c.Close()
	goleak.VerifyNone(t)
}

func TestProduceErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		err       error
		permanent bool
	}{
		{kerr.MessageTooLarge, true},
		{fmt.Errorf("%w (uncompressed_bytes=2000000)", kerr.MessageTooLarge), true},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidTopicException, true},
		{kerr.TopicAuthorizationFailed, true},
		{kerr.UnknownTopicOrPartition, false}, // leadership moving; a missing topic stalls rather than dead-letters
		{kerr.UnknownTopicID, false},          // recreated topic: the sink purges it, the retry succeeds
		{kerr.InvalidRecord, true},
		{kerr.InvalidTimestamp, true},
		{kerr.PolicyViolation, true},

		{kerr.NotLeaderForPartition, false},
		{kerr.LeaderNotAvailable, false},
		{kerr.RequestTimedOut, false},
		{kerr.NotEnoughReplicas, false},
		{kerr.NotEnoughReplicasAfterAppend, false},
		{kerr.CorruptMessage, false},
		{kerr.ClusterAuthorizationFailed, false},
		{kerr.SaslAuthenticationFailed, false},
		{kerr.UnsupportedVersion, false},
		{kerr.UnknownServerError, false},
		{kgo.ErrClientClosed, false},
		{kgo.ErrRecordTimeout, false},
		{kgo.ErrRecordRetries, false},
		{kgo.ErrMaxBuffered, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{errors.New("dial tcp 127.0.0.1:9092: connect: connection refused"), false},
	} {
		err := produceError("outbox.order", tc.err)
		if got := isPermanent(err); got != tc.permanent {
			t.Errorf("%v: permanent = %v, want %v", tc.err, got, tc.permanent)
		}
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), `"outbox.order"`) {
			t.Errorf("%v: %v does not wrap it with the topic", tc.err, err)
		}
	}
	if produceError("t", nil) != nil {
		t.Error("nil error classified as a failure")
	}
}
