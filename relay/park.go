package relay

import (
	"context"
	"fmt"

	"go.uber.org/zap"
)

// DeadLetterOrder says what becomes of an aggregate's later messages once
// one of its messages is dead-lettered.
type DeadLetterOrder string

const (
	// DeadLetterPark (the default) parks the aggregate: its later messages,
	// including those committed after a restart, are stored behind the dead
	// letter (Parking.Park) instead of being published, until the dead
	// letter is replayed with its chain or purged. Other aggregates flow on.
	DeadLetterPark DeadLetterOrder = "park"
	// DeadLetterPass publishes the later messages as if the dead letter had
	// been delivered: consumers see a gap in the aggregate's order.
	DeadLetterPass DeadLetterOrder = "pass"
)

// Head is a dead letter that parks its aggregate.
type Head struct {
	// ID is the dead letter's id in its store.
	ID                         int64
	AggregateType, AggregateID string
	// Sink is the name of the sink whose aggregate it parks (Message.Sink).
	Sink string
}

// Parking stores parked aggregates: the dead letter at the head of each and
// the messages waiting behind it. Implementations must be safe for
// concurrent use, and durable: each method returns only once what it stored
// is committed.
//
// The head is released by another process (`outboxrelay dlq replay` or
// `purge`) while the relay runs. Park and the release must be serialised by
// the store, so that a message is either stored before the release has
// published (or purged) the chain, or reported not parked after it: then
// the relay publishes it, behind the whole chain.
type Parking interface {
	// Heads returns the aggregates parked in the store, for a relay that
	// starts a replication session.
	Heads(ctx context.Context) ([]Head, error)
	// AddHead stores m as a dead letter that parks its aggregate on its
	// sink (m.Sink), with its position (m.CommitLSN, m.LSN).
	AddHead(ctx context.Context, m *Message) error
	// Park stores m behind the dead letter that parks m's aggregate on
	// m's sink (m.Sink) and reports true. It reports false, storing nothing, when no dead letter
	// parks the aggregate any more (it was replayed or purged). A message
	// that is the head itself, or that was committed before it (a
	// redelivery after a restart: it was delivered before the head was
	// dead-lettered), is not stored, and reported true.
	Park(ctx context.Context, m *Message) (bool, error)
}

// parking reports whether dead letters park their aggregates.
func (p *publisher) parking() bool {
	return p.cfg.Parking != nil && p.cfg.DeadLetterOrder == DeadLetterPark && !p.unordered
}

// loadHeads marks the aggregates the store says are parked. It only adds:
// an aggregate marked here that the store released is found out by park.
func (p *publisher) loadHeads(ctx context.Context) error {
	if !p.parking() {
		return nil
	}
	heads, err := p.cfg.Parking.Heads(ctx)
	if err != nil {
		return fmt.Errorf("read parked aggregates: %w", err)
	}
	parked := 0
	for _, h := range heads {
		if h.Sink != p.name {
			continue // another sink's: its aggregates flow here
		}
		p.order.park(aggregateKey{h.AggregateType, h.AggregateID})
		parked++
	}
	if parked > 0 {
		p.log.Info("aggregates parked behind dead letters", zap.Int("aggregates", parked))
	}
	return nil
}

// send hands m, admitted by its aggregate's order, to the sink, or parks it
// when its aggregate is parked.
func (p *publisher) send(ctx context.Context, m *Message) {
	if p.parking() && p.order.parked(keyOf(m)) {
		p.park(m)
		return
	}
	p.publish(ctx, m)
}

// park stores m behind its aggregate's dead letter, then settles it, which
// lets the aggregate's next message come to send. If the store says the
// aggregate was released meanwhile, m goes to the sink instead: the
// release has published the whole chain before it let go of the head.
func (p *publisher) park(m *Message) {
	p.bg.start(func() {
		p.storing.Add(1)
		defer p.storing.Add(-1)
		var parked bool
		if !p.store(m, "park message", "park message %s: %w", func(ctx context.Context) (err error) {
			parked, err = p.cfg.Parking.Park(ctx, m)
			return err
		}) {
			return
		}
		if !parked {
			p.order.unpark(keyOf(m))
			p.log.Info("aggregate released from its dead letter; publishing again",
				zap.String("aggregate_type", m.AggregateType), zap.String("aggregate_id", m.AggregateID))
			p.handoff <- handed{m: m}
			return
		}
		p.log.Debug("parked behind a dead letter", zap.String("message_id", m.ID),
			zap.String("aggregate_type", m.AggregateType), zap.String("aggregate_id", m.AggregateID))
		if h := p.cfg.Hooks.Parked; h != nil {
			h(m)
		}
		p.settle(m, true)
	})
}
