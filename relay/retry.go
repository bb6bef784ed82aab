package relay

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// retryQueue holds the messages whose publish failed until their backoff
// has passed. The sink's goroutines push (publisher.retry); its goroutine
// is the retry loop (run, started by Relay.Run), the only one that takes
// messages out, to publish them again. Retries need no order among
// themselves: each is the only unsettled message of its aggregate. Safe for
// concurrent use.
type retryQueue struct {
	mu      sync.Mutex
	entries []retryEntry // by due time
	kick    chan struct{}
	waiting atomic.Int64 // messages waiting for their next attempt
}

// retryEntry is a failed message and when to publish it again.
type retryEntry struct {
	m   *Message
	due time.Time
}

func newRetryQueue() *retryQueue {
	return &retryQueue{kick: make(chan struct{}, 1)}
}

// retry publishes m again after its backoff.
func (p *publisher) retry(m *Message) {
	wait := p.backoff(m.Attempts)
	p.log.Warn("publish failed; retrying", zap.String("message_id", m.ID), zap.String("destination", m.Destination),
		zap.Int("attempt", m.Attempts), zap.Duration("retry_in", wait), zap.Error(m.LastError))
	p.retries.push(retryEntry{m: m, due: time.Now().Add(wait)})
}

// push queues e and wakes the retry loop.
func (q *retryQueue) push(e retryEntry) {
	q.waiting.Add(1)
	q.mu.Lock()
	i := sort.Search(len(q.entries), func(i int) bool { return q.entries[i].due.After(e.due) })
	q.entries = slices.Insert(q.entries, i, e)
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// run is the retry loop: it hands each queued message to publish once it
// is due, until ctx ends.
func (q *retryQueue) run(ctx context.Context, publish func(context.Context, *Message)) {
	for {
		q.mu.Lock()
		now := time.Now()
		n := 0
		for n < len(q.entries) && !q.entries[n].due.After(now) {
			n++
		}
		due := slices.Clone(q.entries[:n])
		q.entries = slices.Delete(q.entries, 0, n)
		wait := time.Duration(-1)
		if len(q.entries) > 0 {
			wait = q.entries[0].due.Sub(now)
		}
		q.mu.Unlock()
		for _, e := range due {
			q.waiting.Add(-1)
			publish(ctx, e.m)
		}
		if len(due) > 0 {
			continue // publishing took time: look again
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if wait >= 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-q.kick:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}
