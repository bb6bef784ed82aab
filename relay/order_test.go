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

// fault is what scriptedSink does with one publish attempt.
type fault int

const (
	deliver    fault = iota
	nack             // not stored; retryable (a broker nack, a lost connection)
	returned         // not stored; permanent (unroutable, returned by the broker)
	recordFail       // not stored; permanent for this record only (too large, invalid)
	unsure           // stored, but reported failed (a timeout after the write)
)

// scriptedSink is a pipelining broker double for the relay's ordering logic:
// it takes every Publish at once, settles attempts in Publish order in small
// batches from its own goroutine, as a broker acknowledges a pipeline, and
// records which messages it stored, in storing order. Its script decides
// the outcome of each message's attempts. It proves nothing about delivery
// to a real broker: integration/ does that.
type scriptedSink struct {
	script func(id string, attempt int) fault
	queue  chan attempt

	mu       sync.Mutex
	attempts map[string]int
	stored   []*Message // every copy, in storing order
}

type attempt struct {
	m    *Message
	f    fault
	done func(*Message, error)
}

func newScriptedSink(script func(id string, attempt int) fault) *scriptedSink {
	return &scriptedSink{script: script, queue: make(chan attempt, 1<<16), attempts: map[string]int{}}
}

func (s *scriptedSink) Publish(_ context.Context, m *Message, done func(*Message, error)) {
	s.mu.Lock()
	s.attempts[m.ID]++
	n := s.attempts[m.ID]
	s.mu.Unlock()
	s.queue <- attempt{m: m, f: s.script(m.ID, n), done: done}
}

// Run settles queued attempts, a batch every 200µs.
func (s *scriptedSink) Run(ctx context.Context) error {
	for {
		var batch []attempt
		select {
		case <-ctx.Done():
			return nil
		case a := <-s.queue:
			batch = append(batch, a)
		}
		time.Sleep(200 * time.Microsecond)
	more:
		for {
			select {
			case a := <-s.queue:
				batch = append(batch, a)
			default:
				break more
			}
		}
		for _, a := range batch {
			if a.f == deliver || a.f == unsure {
				s.mu.Lock()
				s.stored = append(s.stored, a.m)
				s.mu.Unlock()
			}
			switch a.f {
			case deliver:
				a.done(a.m, nil)
			case nack:
				a.done(a.m, errors.New("broker nacked the message"))
			case returned:
				a.done(a.m, Permanent(errors.New("message returned: no route")))
			case recordFail:
				a.done(a.m, Permanent(errors.New("record rejected")))
			case unsure:
				a.done(a.m, errors.New("request timed out"))
			}
		}
	}
}

func (s *scriptedSink) Ready() bool  { return true }
func (s *scriptedSink) Close() error { return nil }

// aggregateSource streams msgs table-less messages spread over aggregates
// (message i belongs to aggregate i%aggregates), txSize per transaction.
type aggregateSource struct {
	msgs, aggregates, txSize int
	lastEnd                  cdc.LSN // set by Run
}

func (f *aggregateSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	lsn := cdc.LSN(100)
	for i := 0; i < f.msgs; {
		_ = h.Begin(ctx, cdc.Begin{FinalLSN: lsn + cdc.LSN(f.txSize) + 1})
		for j := 0; j < f.txSize && i < f.msgs; j, i = j+1, i+1 {
			lsn++
			c := fmt.Sprintf(`{"id":"m%d","aggregate_type":"order","aggregate_id":"a%d","event_type":"x","payload":{}}`, i, i%f.aggregates)
			if err := h.Message(ctx, &cdc.LogicalMessage{Transactional: true, LSN: lsn, Prefix: "outboxrelay", Content: []byte(c)}); err != nil {
				return err
			}
		}
		lsn += 2
		_ = h.Commit(ctx, cdc.Commit{EndLSN: lsn})
		f.lastEnd = lsn
	}
	return h.Drain(ctx)
}

// TestFirstDeliveriesKeepAggregateOrder fails some attempts of a pipelining
// broker in each way a broker can (nack, return, one failed record, a
// failure reported after the write) and checks that the first stored copy of
// every message comes in commit order within its aggregate, that nothing is
// lost and that the relay confirms the end.
func TestFirstDeliveriesKeepAggregateOrder(t *testing.T) {
	const msgs, aggs = 600, 6
	script := func(id string, attempt int) fault {
		var i int
		fmt.Sscanf(id, "m%d", &i)
		switch {
		case attempt == 1 && i%7 == 3:
			return nack
		case attempt == 1 && i%11 == 5:
			return returned
		case attempt <= 2 && i%13 == 8:
			return recordFail
		case attempt == 1 && i%17 == 2:
			return unsure
		}
		return deliver
	}
	s := newScriptedSink(script)
	dl := &deadLetters{}
	r := New(Config{RetryMin: 2 * time.Millisecond, RetryMax: 20 * time.Millisecond, MaxAttempts: 4}, s, nil, Options{DeadLetters: DeadLetterFunc(dl.add)})
	src := &aggregateSource{msgs: msgs, aggregates: aggs, txSize: 5}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx, src); err != nil {
		t.Fatal(err)
	}
	if len(dl.ids) != 0 {
		t.Errorf("dead-lettered %v; every message succeeds within MaxAttempts", dl.ids)
	}

	first := map[string]bool{}
	arrivals := map[string][]int{} // aggregate -> message numbers, first copies in storing order
	for _, m := range s.stored {
		if first[m.ID] {
			continue
		}
		first[m.ID] = true
		var i int
		fmt.Sscanf(m.ID, "m%d", &i)
		arrivals[m.AggregateID] = append(arrivals[m.AggregateID], i)
	}
	if len(first) != msgs {
		t.Errorf("stored %d distinct messages, want %d", len(first), msgs)
	}
	for agg, got := range arrivals {
		if !slices.IsSorted(got) {
			for k := 1; k < len(got); k++ {
				if got[k] < got[k-1] {
					t.Errorf("aggregate %s: first delivery of m%d after m%d (commit order is by number)", agg, got[k], got[k-1])
					break
				}
			}
		}
	}
	if got := r.handler.Confirmed(); got != src.lastEnd {
		t.Errorf("confirmed %v, want %v", got, src.lastEnd)
	}
}

// TestDeadLetterReleasesAggregate: a message that fails for good holds its
// aggregate's later messages until it is stored as a dead letter, and other
// aggregates are not held at all.
func TestDeadLetterReleasesAggregate(t *testing.T) {
	const msgs, aggs = 60, 3
	script := func(id string, _ int) fault {
		if id == "m4" { // aggregate a1
			return recordFail
		}
		return deliver
	}
	s := newScriptedSink(script)
	var mu sync.Mutex
	var stored bool
	var early []string
	dead := func(_ context.Context, m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		stored = true
		return nil
	}
	r := New(Config{RetryMin: 5 * time.Millisecond, RetryMax: 10 * time.Millisecond, MaxAttempts: 3}, s, nil, Options{DeadLetters: DeadLetterFunc(dead),
		Hooks: Hooks{Published: func(m *Message, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if m.AggregateID == "a1" && !stored {
				var i int
				fmt.Sscanf(m.ID, "m%d", &i)
				if i > 4 {
					early = append(early, m.ID)
				}
			}
		}}})
	src := &aggregateSource{msgs: msgs, aggregates: aggs, txSize: 4}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx, src); err != nil {
		t.Fatal(err)
	}
	if !stored {
		t.Fatal("m4 was not dead-lettered")
	}
	if len(early) > 0 {
		t.Errorf("%v of m4's aggregate acknowledged before m4 was dead-lettered", early)
	}
	if n := len(s.stored); n != msgs-1 {
		t.Errorf("stored %d messages, want %d", n, msgs-1)
	}
}
