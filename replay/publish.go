package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Publisher republishes messages through a relay.Sink. Like the relay, it
// hands the sink at most one unacknowledged message per aggregate, so the
// messages of one aggregate reach the broker in the order they are given to
// Publish, and retries a failed publish until the broker takes it or
// (permanent failures) MaxAttempts is reached.
//
// Publish is called from one goroutine; Wait once, after the last Publish.
type Publisher struct {
	sink relay.Sink
	cfg  PublisherConfig
	log  *zap.Logger

	dlMu sync.Mutex // serialises cfg.DeadLetter

	mu       sync.Mutex
	cond     *sync.Cond
	busy     map[string]bool // aggregates with an unacknowledged message
	inflight int
	result   Result
	next     time.Time // rate limit: when the next message may go
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Rate is the most messages a second; 0 is unlimited.
	Rate float64
	// MaxInFlight bounds the unacknowledged messages (default 1000).
	MaxInFlight int
	// MaxAttempts is how often the broker may refuse a message for good
	// before it counts as failed (default 5). Retryable failures are
	// retried until ctx ends and do not count (relay.Message.Refusals).
	MaxAttempts int
	// Published, when set, is called for every acknowledged message, from
	// sink goroutines.
	Published func(m *relay.Message)
	// DeadLetter, when set, stores a message the broker refused
	// permanently, or an invalid row, as the relay would (it then counts in
	// Result.DeadLettered, not in Failed or Invalid). Calls are serialised.
	DeadLetter func(ctx context.Context, m *relay.Message) error
	// Filtered, when set, is called with the route label
	// (relay.Message.Filtered) of every row the routing rules drop, as the
	// relay's Hooks.Filtered is: the relay's first start counts them in
	// outboxrelay_messages_filtered_total.
	Filtered func(route string)
}

// Result counts what a Publisher did.
type Result struct {
	Published int64
	// Failed lists the ids the broker refused permanently (and Invalid the
	// rows the relay would have dead-lettered, which are not sent).
	Failed  []string
	Invalid []string
	// DeadLettered lists the ids stored through PublisherConfig.DeadLetter,
	// and Held those not sent because they already wait in the dead
	// letters (replay.ErrDeadLettered).
	DeadLettered []string
	Held         []string
	// Filtered counts the rows the routing rules drop (ErrFiltered):
	// never published, and not failed.
	Filtered int64
	// DeadLetterErr is the first failure to store a dead letter.
	DeadLetterErr error
}

// NewPublisher returns a Publisher on sink. It starts nothing; a sink that
// is a relay.Runner must be run by the caller.
func NewPublisher(sink relay.Sink, cfg PublisherConfig, log *zap.Logger) *Publisher {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 1000
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if log == nil {
		log = zap.NewNop()
	}
	p := &Publisher{sink: sink, cfg: cfg, log: log.Named("replay"), busy: map[string]bool{}}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func aggregateKey(m *relay.Message) string { return m.AggregateType + "\x00" + m.AggregateID }

// Publish hands m to the sink once its aggregate's previous message is
// acknowledged, the in-flight bound allows and the rate limit allows. It
// returns ctx.Err() when ctx ends first.
func (p *Publisher) Publish(ctx context.Context, m *relay.Message) error {
	key := aggregateKey(m)
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	for (p.busy[key] || p.inflight >= p.cfg.MaxInFlight) && ctx.Err() == nil {
		p.cond.Wait()
	}
	if err := ctx.Err(); err != nil {
		p.mu.Unlock()
		return err
	}
	p.busy[key] = true
	p.inflight++
	var wait time.Duration
	if p.cfg.Rate > 0 {
		now := time.Now()
		if p.next.Before(now) {
			p.next = now
		}
		wait = p.next.Sub(now)
		p.next = p.next.Add(time.Duration(float64(time.Second) / p.cfg.Rate))
	}
	p.mu.Unlock()
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			p.settle(m, nil)
			return ctx.Err()
		}
	}
	p.sink.Publish(ctx, m, p.doneFunc(ctx))
	return nil
}

// Invalid records a row that cannot be sent: one the routing rules drop
// (ErrFiltered) is counted in Result.Filtered and PublisherConfig.Filtered,
// one already waiting in the dead letters (ErrDeadLettered) is held there,
// any other is dead-lettered when PublisherConfig.DeadLetter is set and
// counted invalid otherwise.
func (p *Publisher) Invalid(ctx context.Context, m *relay.Message, err error) {
	if errors.Is(err, ErrFiltered) {
		p.mu.Lock()
		p.result.Filtered++
		p.mu.Unlock()
		if p.cfg.Filtered != nil {
			p.cfg.Filtered(m.Filtered)
		}
		return
	}
	if errors.Is(err, ErrDeadLettered) {
		p.log.Info("message waits in the dead letters; it is not republished", zap.String("message_id", m.ID))
		p.mu.Lock()
		p.result.Held = append(p.result.Held, m.ID)
		p.mu.Unlock()
		return
	}
	if p.cfg.DeadLetter != nil {
		m.LastError = fmt.Errorf("%w: %w", relay.ErrInvalid, err) // as the relay records it
		p.deadLetter(ctx, m)
		return
	}
	p.log.Warn("row cannot be published; it is not replayed", zap.String("message_id", m.ID), zap.Error(err))
	p.mu.Lock()
	p.result.Invalid = append(p.result.Invalid, m.ID)
	p.mu.Unlock()
}

// deadLetter stores m through cfg.DeadLetter and counts it.
func (p *Publisher) deadLetter(ctx context.Context, m *relay.Message) {
	p.dlMu.Lock()
	err := p.cfg.DeadLetter(ctx, m)
	p.dlMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.log.Error("could not store the dead letter", zap.String("message_id", m.ID), zap.Error(err))
		if p.result.DeadLetterErr == nil {
			p.result.DeadLetterErr = err
		}
		p.result.Failed = append(p.result.Failed, m.ID)
		return
	}
	p.log.Warn("stored as a dead letter", zap.String("message_id", m.ID), zap.Error(m.LastError))
	p.result.DeadLettered = append(p.result.DeadLettered, m.ID)
}

func (p *Publisher) doneFunc(ctx context.Context) func(*relay.Message, error) {
	var done func(*relay.Message, error)
	done = func(m *relay.Message, err error) {
		if err == nil {
			if p.cfg.Published != nil {
				p.cfg.Published(m)
			}
			p.settle(m, &err)
			return
		}
		if ctx.Err() != nil {
			p.settle(m, nil)
			return
		}
		m.Attempts++
		if !relay.Retryable(err) {
			m.Refusals++ // MaxAttempts counts refusals only, as in the relay
		}
		m.LastError = err
		now := time.Now()
		if m.FirstFailure.IsZero() {
			m.FirstFailure = now
		}
		m.LastFailure = now
		if !relay.Retryable(err) && m.Refusals >= p.cfg.MaxAttempts {
			p.log.Error("broker refused the message", zap.String("message_id", m.ID), zap.Int("attempts", m.Attempts), zap.Int("refusals", m.Refusals), zap.Error(err))
			if p.cfg.DeadLetter != nil {
				// Not on the sink's goroutine, which may be needed to
				// answer other publishes.
				go func() {
					p.deadLetter(ctx, m)
					p.settle(m, nil)
				}()
				return
			}
			p.mu.Lock()
			p.result.Failed = append(p.result.Failed, m.ID)
			p.mu.Unlock()
			p.settle(m, nil)
			return
		}
		wait := backoff.Delay(retryMin, retryMax, m.Attempts)
		p.log.Warn("publish failed; retrying", zap.String("message_id", m.ID), zap.Duration("retry_in", wait), zap.Error(err))
		// Not from this goroutine: done may run on a sink goroutine that
		// must not publish.
		time.AfterFunc(wait, func() {
			if ctx.Err() != nil {
				p.settle(m, nil)
				return
			}
			p.sink.Publish(ctx, m, done)
		})
	}
	return done
}

// settle frees m's aggregate; ok non-nil counts m as published.
func (p *Publisher) settle(m *relay.Message, ok *error) {
	p.mu.Lock()
	delete(p.busy, aggregateKey(m))
	p.inflight--
	if ok != nil {
		p.result.Published++
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Wait waits until every published message is settled and returns the
// result. When ctx ends first it returns what is known and ctx.Err().
func (p *Publisher) Wait(ctx context.Context) (Result, error) {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.inflight > 0 && ctx.Err() == nil {
		p.cond.Wait()
	}
	r := p.result
	r.Failed = append([]string(nil), r.Failed...)
	r.Invalid = append([]string(nil), r.Invalid...)
	r.DeadLettered = append([]string(nil), r.DeadLettered...)
	r.Held = append([]string(nil), r.Held...)
	if p.inflight > 0 {
		return r, fmt.Errorf("%d messages unacknowledged: %w", p.inflight, ctx.Err())
	}
	return r, nil
}

// Published returns the number of acknowledged messages so far. Safe for
// concurrent use.
func (p *Publisher) Published() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.result.Published
}

// Bounds of the wait before a refused message is published again.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 10 * time.Second
)

// ErrFailed is returned by Run when some messages could not be published.
var ErrFailed = errors.New("some messages were not published")
