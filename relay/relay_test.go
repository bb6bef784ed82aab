package relay

import (
	"context"
	"errors"
	"fmt"
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
	r := New(Config{RetryMin: 20 * time.Millisecond}, s, nil)
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
	if got := r.Confirmed(); got != 200 {
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
	r := New(Config{DeadLetter: dl.add}, s, nil)
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
	r := New(Config{DeadLetter: dl.add}, s, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx, interleavedSource{}); err != nil {
		t.Fatal(err)
	}
	if got := r.Confirmed(); got != 300 {
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
