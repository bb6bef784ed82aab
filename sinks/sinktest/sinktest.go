// Package sinktest is the test suite every relay.Sink passes, in the manner
// of watermill's pubsub/tests: a sink's tests call [Run] with a [Factory]
// that connects sinks to a real broker and reads back what they published.
//
// The suite checks the relay.Sink contract and the broker-independent part of
// the product contract: every done called exactly once, order per aggregate,
// message ids, traceparent and row headers on the broker message, the
// envelope as the body byte for byte, and no loss across a sink's Close.
// Properties of one broker (Kafka headers, AMQP properties, error mapping)
// stay in that sink's own tests, which share the helpers of this package:
// [PublishAll], [RunSink], [Recorder], [BenchmarkPublish], and a broker
// process of the test's own to kill ([StartServer], [PublishAcrossRestarts]).
package sinktest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Factory connects the suite to one broker.
type Factory interface {
	// NewSink returns a sink connected to the broker and ready to publish.
	// The suite closes it.
	NewSink(t *testing.T) relay.Sink

	// Subscribe returns a Consumer of the messages published from now on
	// for aggregateType, set up before the suite publishes any of them
	// (for RabbitMQ: a queue bound to the exchange for that aggregate type;
	// for Kafka: a consumer of its topic). The factory releases it when t
	// ends.
	Subscribe(t *testing.T, aggregateType string) Consumer
}

// Consumer reads back what a sink published.
type Consumer interface {
	// Next returns the next message received, blocking until there is one
	// or ctx is done. It is called from one goroutine at a time.
	Next(ctx context.Context) (Received, error)
}

// Received is one broker message as a consumer saw it.
type Received struct {
	// ID is the message_id (a header in Kafka, a property in AMQP).
	ID string
	// Key is the partition key or aggregate_id the broker message carries.
	Key string
	// Headers are the broker message's headers, values as strings.
	Headers map[string]string
	// Body is the message body.
	Body []byte
	// All is every header (Kafka, NATS) or field (Redis, the body and the
	// row's headers field aside) the broker message carries, in wire
	// order, repeats kept, so that the suite can check that no name
	// appears twice. Protocol properties that carry a relay-owned value
	// (AMQP message-id, content-type) appear under the relay's header name.
	All []envelope.Header
	// Sequence is the position at which the broker accepted the message
	// (1, 2, ... across the broker), which a Factory that is [Unordered]
	// sets; 0 otherwise.
	Sequence int64
}

// Headerless is implemented by the Factory of a broker whose messages
// carry no headers, only a key and a body (Kinesis): the sink's
// configuration admits only envelope formats that hold everything in the
// body. The suite then checks, in place of the header subtests, that a
// message with headers arrives as its envelope, unchanged, under its
// aggregate's key, and that only an aggregate_id that is not valid UTF-8
// (the key) is refused.
type Headerless interface {
	Headerless()
}

// Unordered is implemented by the Factory of a broker that delivers in no
// promised order (an SQS standard queue: at least once, and a message
// whose receipt was lost comes again only after its visibility timeout,
// behind later ones). All a sink controls there is the order in which the
// broker accepts an aggregate's messages, so OrderPerAggregate checks that
// order, by [Received.Sequence], rather than the order of arrival.
type Unordered interface {
	Unordered()
}

// Timeout bounds each subtest.
var Timeout = 2 * time.Minute

// Run runs the suite. Subtests run one after another, each on aggregate types
// of its own.
func Run(t *testing.T, f Factory) {
	t.Run("Ready", func(t *testing.T) { testReady(t, f) })
	t.Run("OrderPerAggregate", func(t *testing.T) { testOrderPerAggregate(t, f) })
	_, headerless := f.(Headerless)
	if headerless {
		t.Run("HeadersInBody", func(t *testing.T) { testHeaderless(t, f) })
	} else {
		t.Run("Headers", func(t *testing.T) { testHeaders(t, f) })
	}
	t.Run("Body", func(t *testing.T) { testBody(t, f) })
	if !headerless {
		t.Run("SpoofedHeaders", func(t *testing.T) { testSpoofedHeaders(t, f) })
	}
	t.Run("InvalidUTF8", func(t *testing.T) { testInvalidUTF8(t, f, headerless) })
	if !headerless {
		t.Run("CloudEventsBinary", func(t *testing.T) { testCloudEventsBinary(t, f) })
	}
	t.Run("NoLossAcrossClose", func(t *testing.T) { testNoLossAcrossClose(t, f) })
	t.Run("CloseReportsInFlight", func(t *testing.T) { testCloseReportsInFlight(t, f) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelledContext(t, f) })
}

func testReady(t *testing.T, f Factory) {
	s := f.NewSink(t)
	if !s.Ready() {
		t.Error("Ready() = false for a sink the factory connected")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s.Ready() {
		t.Error("Ready() = true after Close")
	}
}

// testOrderPerAggregate publishes from one goroutine, as the relay does, while
// the sink reports outcomes from its own goroutines.
func testOrderPerAggregate(t *testing.T, f Factory) {
	const n, aggregates = 5000, 50
	ctx, at, c, s := open(t, f, "order")

	msgs := Messages(at, n, aggregates)
	PublishAll(ctx, t, s, msgs)

	got := ReceiveAll(ctx, t, c, msgs)
	if _, ok := f.(Unordered); ok {
		got = inSequence(t, got)
	}
	CheckOrder(t, msgs, got)
}

// inSequence returns got in the order the broker accepted the messages.
func inSequence(t *testing.T, got []Received) []Received {
	t.Helper()
	for _, r := range got {
		if r.Sequence <= 0 {
			t.Fatalf("message %s: no Sequence from an Unordered factory", r.ID)
		}
	}
	got = slices.Clone(got)
	slices.SortStableFunc(got, func(a, b Received) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return got
}

func testHeaders(t *testing.T, f Factory) {
	ctx, at, c, s := open(t, f, "headers")

	msgs := Messages(at, 10, 3)
	for i, m := range msgs {
		m.Headers = []envelope.Header{
			{Key: "tenant", Value: "acme"},
			{Key: "x-sequence", Value: fmt.Sprint(i)},
		}
	}
	PublishAll(ctx, t, s, msgs)
	for _, m := range msgs {
		if m.Destination == "" {
			t.Errorf("message %s: Destination not set", m.ID)
		}
	}

	byID := index(msgs)
	for _, r := range ReceiveAll(ctx, t, c, msgs) {
		m := byID[r.ID]
		if r.Key != m.AggregateID {
			t.Errorf("message %s: key %q, want aggregate_id %q", r.ID, r.Key, m.AggregateID)
		}
		want := map[string]string{
			"traceparent": m.Traceparent,
			"tenant":      "acme",
			"x-sequence":  m.Headers[1].Value,
		}
		for k, v := range want {
			if got, ok := r.Headers[k]; !ok || got != v {
				t.Errorf("message %s: header %q = %q (present %v), want %q", r.ID, k, got, ok, v)
			}
		}
	}
}

// testHeaderless: on a broker without headers, a message with row headers
// arrives as its envelope, byte for byte, under its aggregate's key.
func testHeaderless(t *testing.T, f Factory) {
	ctx, at, c, s := open(t, f, "headerless")

	msgs := Messages(at, 10, 3)
	for i, m := range msgs {
		m.Headers = []envelope.Header{{Key: "tenant", Value: "acme"}, {Key: "x-sequence", Value: fmt.Sprint(i)}}
	}
	PublishAll(ctx, t, s, msgs)
	byID := index(msgs)
	for _, r := range ReceiveAll(ctx, t, c, msgs) {
		m := byID[r.ID]
		if m.Destination == "" {
			t.Errorf("message %s: Destination not set", m.ID)
		}
		if r.Key != m.AggregateID {
			t.Errorf("message %s: key %q, want aggregate_id %q", r.ID, r.Key, m.AggregateID)
		}
		if !bytes.Equal(r.Body, m.Envelope) {
			t.Errorf("message %s: body %q, want the envelope %q", r.ID, r.Body, m.Envelope)
		}
	}
}

func testBody(t *testing.T, f Factory) {
	ctx, at, c, s := open(t, f, "body")

	msgs := Messages(at, 5, 5)
	// Bodies a sink must not re-encode: non-ASCII, escapes, no trailing newline, large.
	msgs[1].Envelope = []byte(`{"message_id":"` + msgs[1].ID + `","payload":{"name":"Zoë ✓ 日本","esc":"a\"b\\c\u0000"}}`)
	msgs[2].Envelope = []byte(`{"message_id":"` + msgs[2].ID + `","payload":{}}` + "\n")
	msgs[3].Envelope = append([]byte(`{"message_id":"`+msgs[3].ID+`","payload":"`), bytes.Repeat([]byte("x"), 100_000)...)
	msgs[3].Envelope = append(msgs[3].Envelope, `"}`...)
	want := make(map[string][]byte, len(msgs))
	for _, m := range msgs {
		want[m.ID] = bytes.Clone(m.Envelope)
	}
	PublishAll(ctx, t, s, msgs)

	for _, r := range ReceiveAll(ctx, t, c, msgs) {
		if !bytes.Equal(r.Body, want[r.ID]) {
			t.Errorf("message %s: body differs from the envelope:\n got %.200q\nwant %.200q", r.ID, r.Body, want[r.ID])
		}
	}
}

// testNoLossAcrossClose is the relay's restart: half the messages through one
// sink, Close, the rest through a new sink.
func testNoLossAcrossClose(t *testing.T, f Factory) {
	const n = 2000
	ctx := testContext(t)
	at := aggregateType("reopen")
	c := f.Subscribe(t, at)
	msgs := Messages(at, n, 20)
	tr := NewTracker(msgs)

	s1 := f.NewSink(t)
	for _, m := range msgs[:n/2] {
		s1.Publish(ctx, m, tr.Done)
	}
	tr.WaitFor(ctx, t, n/2)
	closeSink(t, s1)

	s2 := f.NewSink(t)
	defer closeSink(t, s2)
	for _, m := range msgs[n/2:] {
		s2.Publish(ctx, m, tr.Done)
	}
	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)

	got := ReceiveAll(ctx, t, c, msgs)
	if _, ok := f.(Unordered); ok {
		got = inSequence(t, got)
	}
	CheckOrder(t, msgs, got)
}

// testCloseReportsInFlight closes a sink with messages in flight: Close must
// report every one before it returns, and every one reported as published
// must be on the broker.
func testCloseReportsInFlight(t *testing.T, f Factory) {
	const n = 2000
	ctx := testContext(t)
	at := aggregateType("inflight")
	c := f.Subscribe(t, at)
	msgs := Messages(at, n, 20)
	tr := NewTracker(msgs)

	s := f.NewSink(t)
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	closeSink(t, s)
	if got := tr.Reported(); got != n {
		t.Fatalf("Close returned with %d of %d messages reported", got, n)
	}
	var acked []*relay.Message
	for i, m := range msgs {
		err := tr.Err(i)
		if err == nil {
			acked = append(acked, m)
		} else if !relay.Retryable(err) {
			t.Errorf("message %s failed at Close with a permanent error: %v", m.ID, err)
		}
	}
	t.Logf("%d of %d messages acknowledged before Close", len(acked), n)
	if len(acked) > 0 {
		receive(ctx, t, c, msgs, acked)
	}
}

// testCancelledContext: a Publish whose context is already done reports
// each message once, either published or with the context's error.
func testCancelledContext(t *testing.T, f Factory) {
	at := aggregateType("cancel")
	s := f.NewSink(t)
	defer closeSink(t, s)
	msgs := Messages(at, 3, 1)
	tr := NewTracker(msgs)
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	tr.Wait(testContext(t), t)
	for i, m := range msgs {
		if err := tr.Err(i); err != nil && (!errors.Is(err, context.Canceled) || !relay.Retryable(err)) {
			t.Errorf("message %s with a cancelled context: err %v, want nil or a retryable context.Canceled", m.ID, err)
		}
	}
}

// Messages returns n messages of aggregateType spread over the given number
// of aggregates in an interleaved order, each with a distinct id, traceparent
// and envelope.
func Messages(aggregateType string, n, aggregates int) []*relay.Message {
	run := RandomHex(4)
	msgs := make([]*relay.Message, n)
	now := time.Now().UTC()
	for i := range msgs {
		id := fmt.Sprintf("%s-0000-7000-8000-%012x", run, i)
		agg := fmt.Sprintf("%s-%03d", aggregateType, (i*7)%aggregates)
		tp := fmt.Sprintf("00-%s%024x-%016x-01", run, i, i+1)
		msgs[i] = &relay.Message{
			ID:            id,
			AggregateType: aggregateType,
			AggregateID:   agg,
			EventType:     aggregateType + ".created",
			Table:         "public.outbox",
			Traceparent:   tp,
			CommitTime:    now,
			Envelope: fmt.Appendf(nil,
				`{"envelope_version":1,"message_id":%q,"event_type":"%s.created","aggregate_type":%q,"aggregate_id":%q,"traceparent":%q,"payload":{"seq":%d}}`,
				id, aggregateType, aggregateType, agg, tp, i),
		}
	}
	return msgs
}

// Tracker records the outcomes reported through done, checking each message
// is reported exactly once. Done is safe for concurrent use.
type Tracker struct {
	idx      map[*relay.Message]int
	calls    []atomic.Int32
	errs     []error
	mu       sync.Mutex
	reported atomic.Int64
	extra    atomic.Int64 // calls beyond the first for a message, or for unknown messages
	changed  chan struct{}
}

// NewTracker tracks msgs.
func NewTracker(msgs []*relay.Message) *Tracker {
	tr := &Tracker{
		idx:     make(map[*relay.Message]int, len(msgs)),
		calls:   make([]atomic.Int32, len(msgs)),
		errs:    make([]error, len(msgs)),
		changed: make(chan struct{}, 1),
	}
	for i, m := range msgs {
		tr.idx[m] = i
	}
	return tr
}

// Done is the done callback to pass to Publish.
func (tr *Tracker) Done(m *relay.Message, err error) {
	i, ok := tr.idx[m]
	if !ok || tr.calls[i].Add(1) > 1 {
		tr.extra.Add(1)
		return
	}
	tr.mu.Lock()
	tr.errs[i] = err
	tr.mu.Unlock()
	tr.reported.Add(1)
	select {
	case tr.changed <- struct{}{}:
	default:
	}
}

// Reported is the number of messages reported so far.
func (tr *Tracker) Reported() int { return int(tr.reported.Load()) }

// Err is the error reported for message i.
func (tr *Tracker) Err(i int) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.errs[i]
}

// Wait waits until every message has been reported, failing t on ctx's end
// and if any message was reported twice.
func (tr *Tracker) Wait(ctx context.Context, t testing.TB) { tr.WaitFor(ctx, t, len(tr.calls)) }

// WaitFor waits until n messages have been reported.
func (tr *Tracker) WaitFor(ctx context.Context, t testing.TB, n int) {
	t.Helper()
	for tr.Reported() < n {
		select {
		case <-tr.changed:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("%d of %d messages reported: %v", tr.Reported(), n, ctx.Err())
		}
	}
	if x := tr.extra.Load(); x > 0 {
		t.Fatalf("done called %d extra times", x)
	}
}

// CheckAllAcked fails t unless every message was reported with a nil error.
func (tr *Tracker) CheckAllAcked(t testing.TB) {
	t.Helper()
	failed := 0
	for i := range tr.calls {
		if err := tr.Err(i); err != nil {
			if failed++; failed <= 5 {
				t.Errorf("message %d: done(%v), want nil", i, err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d messages failed", failed, len(tr.calls))
	}
	if x := tr.extra.Load(); x > 0 {
		t.Fatalf("done called %d extra times", x)
	}
}

// ReceiveAll reads from c until every message of want has arrived and returns
// everything read, duplicates included, in arrival order. It fails t on a
// message not in want.
func ReceiveAll(ctx context.Context, t testing.TB, c Consumer, want []*relay.Message) []Received {
	t.Helper()
	return receive(ctx, t, c, want, want)
}

// receive reads from c until every message of want has arrived, failing t on
// a message not in allowed.
func receive(ctx context.Context, t testing.TB, c Consumer, allowed, want []*relay.Message) []Received {
	t.Helper()
	ok := make(map[string]bool, len(allowed))
	for _, m := range allowed {
		ok[m.ID] = true
	}
	missing := make(map[string]bool, len(want))
	for _, m := range want {
		missing[m.ID] = true
	}
	seen := make(map[string]bool, len(allowed))
	var got []Received
	for len(missing) > 0 {
		r, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("received %d messages, %d missing: %v", len(got), len(missing), err)
		}
		if !ok[r.ID] {
			t.Fatalf("received unexpected message %q", r.ID)
		}
		got = append(got, r)
		seen[r.ID] = true
		delete(missing, r.ID)
	}
	if dups := len(got) - len(seen); dups > 0 {
		t.Logf("%d duplicates received (allowed: at-least-once)", dups)
	}
	return got
}

// CheckOrder fails t unless, per aggregate and ignoring repeats of a message
// already received, messages arrived in the order of msgs. Messages got must
// carry their aggregate id as Key.
func CheckOrder(t testing.TB, msgs []*relay.Message, got []Received) {
	t.Helper()
	pos := make(map[string]int, len(msgs))
	for i, m := range msgs {
		pos[m.ID] = i
	}
	last := map[string]int{}
	seen := map[string]bool{}
	bad := 0
	for _, r := range got {
		if seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		p := pos[r.ID]
		if msgs[p].AggregateID != r.Key {
			t.Errorf("message %s arrived with key %q, want %q", r.ID, r.Key, msgs[p].AggregateID)
		}
		if prev, ok := last[r.Key]; ok && prev > p {
			if bad++; bad <= 5 {
				t.Errorf("aggregate %s: message #%d arrived after #%d", r.Key, p, prev)
			}
		}
		last[r.Key] = p
	}
	if bad > 0 {
		t.Fatalf("%d messages out of order", bad)
	}
}

func index(msgs []*relay.Message) map[string]*relay.Message {
	m := make(map[string]*relay.Message, len(msgs))
	for _, msg := range msgs {
		m[msg.ID] = msg
	}
	return m
}

// open is the start of a subtest that publishes through one sink: a
// context bounded by Timeout, a fresh aggregate type, a consumer of it and
// a sink that is closed when the subtest ends.
func open(t *testing.T, f Factory, name string) (context.Context, string, Consumer, relay.Sink) {
	ctx := testContext(t)
	at := aggregateType(name)
	c := f.Subscribe(t, at)
	s := f.NewSink(t)
	t.Cleanup(func() { closeSink(t, s) })
	return ctx, at, c, s
}

func closeSink(t testing.TB, s relay.Sink) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// aggregateType returns a fresh aggregate type, so that every subtest, and
// every run against a long-lived broker, has destinations of its own. It is
// valid in Kafka topic names and AMQP routing keys.
func aggregateType(name string) string { return "sinktest_" + name + "_" + RandomHex(4) }

// RandomHex returns n random bytes in hex, for names of the test's own.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(errors.New("crypto/rand: " + err.Error()))
	}
	return hex.EncodeToString(b)
}

// testSpoofedHeaders: row headers named like the relay's own never repeat
// or override them, whatever their case; other row headers go through.
func testSpoofedHeaders(t *testing.T, f Factory) {
	ctx, at, c, s := open(t, f, "spoof")

	msgs := Messages(at, 3, 1)
	for _, m := range msgs {
		m.Headers = []envelope.Header{
			{Key: "message_id", Value: "SPOOFED"},
			{Key: "event_type", Value: "SPOOFED"},
			{Key: "traceparent", Value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			{Key: "Content-Type", Value: "text/spoofed"},
			{Key: "content-type", Value: "text/spoofed"},
			{Key: "aggregate_id", Value: "SPOOFED"},
			{Key: "ce_id", Value: "SPOOFED"},
			{Key: "ce-id", Value: "SPOOFED"},
			{Key: "cloudEvents:id", Value: "SPOOFED"},
			{Key: "tenant", Value: "acme"},
		}
	}
	PublishAll(ctx, t, s, msgs)
	byID := index(msgs)
	for _, r := range ReceiveAll(ctx, t, c, msgs) {
		m := byID[r.ID]
		if r.All == nil {
			t.Fatalf("the factory's consumer does not fill Received.All")
		}
		CheckOneEach(t, m, r)
		if r.Headers["tenant"] != "acme" {
			t.Errorf("message %s: row header tenant = %q, want acme", m.ID, r.Headers["tenant"])
		}
	}
}

// testInvalidUTF8: a message whose aggregate_id (a record key or a header,
// by broker), event_type or row header is not valid UTF-8 fails
// permanently and is never delivered; the messages around it are. On a
// headerless broker only the aggregate_id (the key) reaches it.
func testInvalidUTF8(t *testing.T, f Factory, headerless bool) {
	ctx, at, c, s := open(t, f, "utf8")

	msgs := Messages(at, 5, 5)
	bad := []*relay.Message{msgs[1], msgs[2], msgs[3]}
	good := []*relay.Message{msgs[0], msgs[4]}
	if headerless {
		bad = []*relay.Message{msgs[1], msgs[1], msgs[1]}
		good = []*relay.Message{msgs[0], msgs[2], msgs[3], msgs[4]}
	}
	msgs[1].AggregateID = "caf\xe9"
	msgs[2].EventType = at + ".cr\xe9ated"
	msgs[3].Headers = append(msgs[3].Headers, envelope.Header{Key: "tenant", Value: "\xff"})
	tr := NewTracker(msgs)
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	tr.Wait(ctx, t)
	for i, m := range msgs {
		err := tr.Err(i)
		isBad := m == bad[0] || m == bad[1] || m == bad[2]
		switch {
		case isBad && (err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), "is not valid UTF-8")):
			t.Errorf("message %s: %v, want a permanent error saying what is not valid UTF-8", m.ID, err)
		case !isBad && err != nil:
			t.Errorf("message %s: %v", m.ID, err)
		}
	}
	for _, r := range ReceiveAll(ctx, t, c, good) {
		if r.ID == bad[0].ID || r.ID == bad[1].ID || r.ID == bad[2].ID {
			t.Errorf("received %s, which is not valid UTF-8", r.ID)
		}
	}
}

// CheckOneEach fails t when a relay-owned header of m appears more than
// once in r (names compared case-insensitively), with another value than
// the relay's, or when any header carries the value SPOOFED.
func CheckOneEach(t testing.TB, m *relay.Message, r Received) {
	t.Helper()
	want := map[string]string{
		"message_id": m.ID, "event_type": m.EventType, "traceparent": m.Traceparent,
		"content-type": contentType(m), "aggregate_id": m.AggregateID,
	}
	seen := map[string]int{}
	for _, h := range r.All {
		k := strings.ToLower(h.Key)
		seen[k]++
		if v, ok := want[k]; ok && h.Value != v {
			t.Errorf("message %s: header %s = %q, want the relay's %q", m.ID, h.Key, h.Value, v)
		}
		if h.Value == "SPOOFED" || h.Value == "text/spoofed" {
			t.Errorf("message %s: header %s carries the row's spoofed value", m.ID, h.Key)
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("message %s: header %s appears %d times, want once", m.ID, k, n)
		}
	}
}

func contentType(m *relay.Message) string {
	if m.ContentType == "" {
		return "application/json"
	}
	return m.ContentType
}

// testCloudEventsBinary: in binary content mode every attribute but
// datacontenttype travels once, under one CloudEvents prefix (ce_, ce- or
// cloudEvents:), and the content type is the event's datacontenttype.
func testCloudEventsBinary(t *testing.T, f Factory) {
	ctx, at, c, s := open(t, f, "cebinary")

	msgs := Messages(at, 3, 1)
	for _, m := range msgs {
		m.ContentType = "text/plain; charset=utf-8"
		m.Envelope = []byte("plain text payload")
		m.Attributes = []envelope.Header{
			{Key: "specversion", Value: "1.0"}, {Key: "id", Value: m.ID}, {Key: "source", Value: "/sinktest"},
			{Key: "type", Value: m.EventType}, {Key: "subject", Value: m.AggregateID},
			{Key: "time", Value: "2026-11-29T08:00:00.123456Z"}, {Key: "datacontenttype", Value: m.ContentType},
			{Key: "traceparent", Value: m.Traceparent}, {Key: "schemaversion", Value: "1"},
		}
	}
	PublishAll(ctx, t, s, msgs)
	byID := index(msgs)
	for _, r := range ReceiveAll(ctx, t, c, msgs) {
		m := byID[r.ID]
		if r.All == nil {
			t.Fatalf("the factory's consumer does not fill Received.All")
		}
		CheckOneEach(t, m, r)
		attrs := map[string][]string{}
		for _, h := range r.All {
			for _, p := range []string{"ce_", "ce-", "cloudEvents:"} {
				if name, ok := strings.CutPrefix(h.Key, p); ok {
					attrs[name] = append(attrs[name], h.Value)
				}
			}
		}
		for _, a := range m.Attributes {
			got := attrs[a.Key]
			switch {
			case a.Key == "datacontenttype" && len(got) > 0:
				t.Errorf("message %s: datacontenttype sent as an attribute header %q; the bindings carry it in the content type", m.ID, got)
			case a.Key != "datacontenttype" && (len(got) != 1 || got[0] != a.Value):
				t.Errorf("message %s: attribute %s = %q, want once %q", m.ID, a.Key, got, a.Value)
			}
		}
		if !bytes.Equal(r.Body, m.Envelope) {
			t.Errorf("message %s: body %q, want %q", m.ID, r.Body, m.Envelope)
		}
	}
}
