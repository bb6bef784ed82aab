package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// memParking is an in-memory Parking whose release, like `dlq replay`,
// takes the chain under the same lock as Park.
type memParking struct {
	mu       sync.Mutex
	heads    map[aggregateKey]string // aggregate -> head message id
	chain    []string                // parked ids, in parking order
	released []string                // the chain taken by release
	after    int                     // release once this many are parked; 0: never
}

func (p *memParking) Heads(context.Context) ([]Head, error) { return nil, nil }

func (p *memParking) AddHead(_ context.Context, m *Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.heads == nil {
		p.heads = map[aggregateKey]string{}
	}
	p.heads[keyOf(m)] = m.ID
	return nil
}

func (p *memParking) Park(_ context.Context, m *Message) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.heads[keyOf(m)]; !ok {
		return false, nil
	}
	p.chain = append(p.chain, m.ID)
	if p.after > 0 && len(p.chain) == p.after {
		p.released = append(p.released, p.chain...)
		delete(p.heads, keyOf(m))
	}
	return true, nil
}

func number(id string) int {
	var i int
	fmt.Sscanf(id, "m%d", &i)
	return i
}

// TestDeadLetterParksAggregateInRelay: once m4 (aggregate a1) is
// dead-lettered, a1's later messages go to the parking store in commit
// order, none to the sink, other aggregates are all delivered, and the
// relay confirms the end. When the store releases the aggregate (a replay)
// the relay publishes a1's next messages, each after the released chain.
func TestDeadLetterParksAggregateInRelay(t *testing.T) {
	const msgs, aggs = 90, 3
	for _, after := range []int{0, 5} {
		t.Run(fmt.Sprintf("release after %d", after), func(t *testing.T) {
			s := newScriptedSink(func(id string, _ int) fault {
				if id == "m4" {
					return recordFail
				}
				return deliver
			})
			park := &memParking{after: after}
			r := New(Config{RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond, MaxAttempts: 2}, s, nil, Options{
				DeadLetters: DeadLetterFunc(func(context.Context, *Message) error { t.Error("m4 stored without parking its aggregate"); return nil }),
				Parking:     park})
			src := &aggregateSource{msgs: msgs, aggregates: aggs, txSize: 4}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := r.Run(ctx, src); err != nil {
				t.Fatal(err)
			}
			if got := r.handler.Confirmed(); got != src.lastEnd {
				t.Errorf("confirmed %v, want %v: parking must let the slot advance", got, src.lastEnd)
			}
			var published []int // a1's, after m4
			others := 0
			for _, m := range s.stored {
				switch {
				case m.AggregateID != "a1":
					others++
				case number(m.ID) > 4:
					published = append(published, number(m.ID))
				}
			}
			if want := msgs - msgs/aggs; others != want {
				t.Errorf("delivered %d messages of other aggregates, want %d", others, want)
			}
			var chain []int
			for _, id := range park.chain {
				chain = append(chain, number(id))
			}
			if !slices.IsSorted(chain) || !slices.IsSorted(published) {
				t.Errorf("parked %v, published %v: each must be in commit order", chain, published)
			}
			if n := len(chain) + len(published); n != msgs/aggs-2 {
				t.Errorf("a1: %d parked and %d published after m4, want %d in all", len(chain), len(published), msgs/aggs-2)
			}
			if after == 0 && len(published) > 0 {
				t.Errorf("a1 messages %v published while their aggregate is parked", published)
			}
			if after > 0 && (len(published) == 0 || published[0] < chain[len(chain)-1]) {
				t.Errorf("after the release of chain %v, published %v: each must come after the chain", chain, published)
			}
		})
	}
}
