package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// flakySink fails every message's first attempt with a retryable error and
// records the order of the attempts that succeed. It tests the relay's retry
// ordering, not delivery: delivery is proven against real brokers in
// integration/.
type flakySink struct {
	mu    sync.Mutex
	seen  map[string]int
	order []string
}

func (s *flakySink) Publish(_ context.Context, m *Message, done func(*Message, error)) {
	s.mu.Lock()
	s.seen[m.ID]++
	first := s.seen[m.ID] == 1
	if !first {
		s.order = append(s.order, m.ID)
	}
	s.mu.Unlock()
	if first {
		done(m, errors.New("connection reset"))
		return
	}
	done(m, nil)
}
func (s *flakySink) Ready() bool  { return true }
func (s *flakySink) Close() error { return nil }

// emitSource hands the relay n table-less messages of one aggregate in one transaction.
type emitSource struct {
	n             int
	transactional bool
}

func (f emitSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	_ = h.Begin(ctx, cdc.Begin{FinalLSN: 100})
	for i := 0; i < f.n; i++ {
		c := fmt.Sprintf(`{"id":"m%d","aggregate_type":"order","aggregate_id":"42","event_type":"x","payload":{}}`, i)
		if err := h.Message(ctx, &cdc.LogicalMessage{Transactional: f.transactional, LSN: cdc.LSN(10 + i), Prefix: "outboxrelay", Content: []byte(c)}); err != nil {
			return err
		}
	}
	_ = h.Commit(ctx, cdc.Commit{EndLSN: 200})
	return h.Drain(ctx)
}

func TestRetriesKeepPublishOrder(t *testing.T) {
	s := &flakySink{seen: map[string]int{}}
	r := New(Config{RetryMin: 20 * time.Millisecond}, s, nil, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx, emitSource{n: 10, transactional: true}); err != nil {
		t.Fatal(err)
	}
	if len(s.order) != 10 {
		t.Fatalf("published %d of 10: %v", len(s.order), s.order)
	}
	for i, id := range s.order {
		if id != fmt.Sprintf("m%d", i) {
			t.Fatalf("retries changed the order within an aggregate: %v", s.order)
		}
	}
	if got := r.handler.Confirmed(); got != 200 {
		t.Fatalf("confirmed %v, want 200 once every retry succeeded", got)
	}
}

// deadLetters records what the relay dead-letters.
type deadLetters struct {
	mu  sync.Mutex
	ids []string
}

func (d *deadLetters) add(_ context.Context, m *Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = append(d.ids, m.ID)
	return nil
}

func TestNonTransactionalMessagesAreDeadLettered(t *testing.T) {
	s := &flakySink{seen: map[string]int{}}
	dl := &deadLetters{}
	r := New(Config{}, s, nil, Options{DeadLetters: DeadLetterFunc(dl.add)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx, emitSource{n: 3, transactional: false}); err != nil {
		t.Fatal(err)
	}
	if len(s.seen) != 0 || len(dl.ids) != 3 {
		t.Fatalf("published %v, dead-lettered %v; a non-transactional message may be from a rolled-back transaction", s.seen, dl.ids)
	}
}

// interleavedSource sends a non-transactional message between the changes
// of an open transaction.
type interleavedSource struct{}

func (interleavedSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	msg := func(id string, transactional bool, lsn cdc.LSN) error {
		c := fmt.Sprintf(`{"id":%q,"aggregate_type":"order","aggregate_id":"42","event_type":"x","payload":{}}`, id)
		return h.Message(ctx, &cdc.LogicalMessage{Transactional: transactional, LSN: lsn, Prefix: "outboxrelay", Content: []byte(c)})
	}
	_ = h.Begin(ctx, cdc.Begin{FinalLSN: 150})
	if err := msg("in-tx", true, 110); err != nil {
		return err
	}
	if err := msg("loose", false, 120); err != nil {
		return err
	}
	_ = h.Commit(ctx, cdc.Commit{EndLSN: 200})
	_ = h.Begin(ctx, cdc.Begin{FinalLSN: 250})
	if err := msg("next", true, 210); err != nil {
		return err
	}
	_ = h.Commit(ctx, cdc.Commit{EndLSN: 300})
	return h.Drain(ctx)
}

func TestNonTransactionalMessageInsideTransactionKeepsWatermark(t *testing.T) {
	s := &okSink{}
	dl := &deadLetters{}
	r := New(Config{}, s, nil, Options{DeadLetters: DeadLetterFunc(dl.add)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx, interleavedSource{}); err != nil {
		t.Fatal(err)
	}
	if got := r.handler.Confirmed(); got != 300 {
		t.Fatalf("confirmed %v after every message was acknowledged or dead-lettered, want 300: a non-transactional message inside a transaction must not stop the watermark", got)
	}
	if len(dl.ids) != 1 || dl.ids[0] != "loose" {
		t.Fatalf("dead-lettered %v, want [loose]", dl.ids)
	}
}

// okSink acknowledges every message at once.
type okSink struct{}

func (okSink) Publish(_ context.Context, m *Message, done func(*Message, error)) { done(m, nil) }
func (okSink) Ready() bool                                                       { return true }
func (okSink) Close() error                                                      { return nil }

// holdingSink keeps every message until the test answers it.
type holdingSink struct {
	mu   sync.Mutex
	held []*Message
	done func(*Message, error)
}

func (s *holdingSink) Publish(_ context.Context, m *Message, done func(*Message, error)) {
	s.mu.Lock()
	s.held, s.done = append(s.held, m), done
	s.mu.Unlock()
}
func (s *holdingSink) Ready() bool  { return true }
func (s *holdingSink) Close() error { return nil }

func (s *holdingSink) answerAll() {
	s.mu.Lock()
	held, done := s.held, s.done
	s.held = nil
	s.mu.Unlock()
	for _, m := range held {
		done(m, nil)
	}
}

// TestUnansweredAndLagSince: a sink that holds messages shows in
// Unanswered, and LagSince stays at the oldest unacknowledged commit until
// the broker answers.
func TestUnansweredAndLagSince(t *testing.T) {
	sink := &holdingSink{}
	r := New(Config{}, sink, nil, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error)
	defer func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	commit := time.Now().Add(-time.Minute)
	go func() { stopped <- r.Run(ctx, blockSource{}) }()
	time.Sleep(10 * time.Millisecond)
	if d, n := r.Unanswered(); d != 0 || n != 0 {
		t.Fatalf("nothing published: unanswered %s for %d", d, n)
	}
	_ = r.handler.Begin(ctx, cdc.Begin{FinalLSN: 100, CommitTime: commit})
	for i := range 3 {
		c := fmt.Sprintf(`{"id":"m%d","aggregate_type":"order","aggregate_id":"%d","event_type":"x","payload":{}}`, i, i)
		if err := r.handler.Message(ctx, &cdc.LogicalMessage{Transactional: true, LSN: cdc.LSN(10 + i), Prefix: "outboxrelay", Content: []byte(c)}); err != nil {
			t.Fatal(err)
		}
	}
	_ = r.handler.Commit(ctx, cdc.Commit{EndLSN: 200})
	time.Sleep(50 * time.Millisecond)
	if d, n := r.Unanswered(); d < 50*time.Millisecond || n != 3 {
		t.Errorf("sink holds 3: unanswered %s for %d, want >= 50ms for 3", d, n)
	}
	if got := r.LagSince(); !got.Equal(commit) {
		t.Errorf("LagSince = %v, want the pending commit %v", got, commit)
	}
	sink.answerAll()
	if d, n := r.Unanswered(); d != 0 || n != 0 {
		t.Errorf("all answered: unanswered %s for %d", d, n)
	}
	if got := r.LagSince(); !got.Equal(commit) {
		t.Errorf("nothing pending: LagSince = %v, want the newest commit seen %v", got, commit)
	}
}

// blockSource starts the session and waits for cancellation; the test
// drives the Handler itself.
type blockSource struct{}

func (blockSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// headerSource hands the relay one table-less message whose headers spoof
// reserved names in several spellings.
type headerSource struct{}

func (headerSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	_ = h.Begin(ctx, cdc.Begin{FinalLSN: 100})
	c := `{"id":"m1","aggregate_type":"order","aggregate_id":"42","event_type":"x","payload":{},
		"headers":{"Message_ID":"SPOOFED","tenant":"acme","ce_id":"x","CE_type":"y","id":"z"}}`
	if err := h.Message(ctx, &cdc.LogicalMessage{Transactional: true, LSN: 10, Prefix: "outboxrelay", Content: []byte(c)}); err != nil {
		return err
	}
	_ = h.Commit(ctx, cdc.Commit{EndLSN: 200})
	return h.Drain(ctx)
}

// TestReservedHeaderDroppedHook: every dropped row header is reported once,
// under the reserved name or prefix it matched, and the kept ones are not.
func TestReservedHeaderDroppedHook(t *testing.T) {
	var mu sync.Mutex
	var got []string
	r := New(Config{}, okSink{}, nil, Options{Hooks: Hooks{ReservedHeaderDropped: func(m *Message, reserved string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, m.ID+":"+reserved)
	}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx, headerSource{}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []string{"m1:ce_*", "m1:ce_*", "m1:id", "m1:message_id"}
	if !slices.Equal(got, want) {
		t.Fatalf("hook saw %v, want %v", got, want)
	}
}
