package replay

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
)

// refusingSink answers each attempt of a message as its script says:
// retryable failures, then refusals, then an acknowledgement. It counts
// attempts and proves nothing about delivery to a broker (integration/
// does that): it drives the Publisher's attempt counting.
type refusingSink struct {
	nacks, refusals int // per message, before it is taken

	mu       sync.Mutex
	attempts map[string]int
}

func (s *refusingSink) Publish(_ context.Context, m *relay.Message, done func(*relay.Message, error)) {
	s.mu.Lock()
	s.attempts[m.ID]++
	n := s.attempts[m.ID]
	s.mu.Unlock()
	switch {
	case n <= s.nacks:
		done(m, errors.New("broker unavailable"))
	case n <= s.nacks+s.refusals:
		done(m, relay.Permanent(errors.New("message refused")))
	default:
		done(m, nil)
	}
}

func (s *refusingSink) Ready() bool  { return true }
func (s *refusingSink) Close() error { return nil }

// TestPublisherMaxAttemptsCountsRefusals: as in the relay, MaxAttempts
// counts refusals only. A message failed three times retryably and then
// refused once, under MaxAttempts 2, is published on its next attempt;
// before, it counted as failed at its first refusal.
func TestPublisherMaxAttemptsCountsRefusals(t *testing.T) {
	s := &refusingSink{nacks: 3, refusals: 1, attempts: map[string]int{}}
	p := NewPublisher(s, PublisherConfig{MaxAttempts: 2}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, &relay.Message{ID: "m1", AggregateType: "order", AggregateID: "1"}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 1 || len(res.Failed) != 0 || s.attempts["m1"] != 5 {
		t.Errorf("published %d, failed %v after %d attempts; want published on the 5th attempt (3 retryable failures, 1 refusal, under MaxAttempts 2)",
			res.Published, res.Failed, s.attempts["m1"])
	}
}
