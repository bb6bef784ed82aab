package relay

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// NamedSink is one of the sinks a Relay feeds from its one Source
// (NewSinks), under the name routes pick it by (rules.Route.Sink).
type NamedSink struct {
	// Name is the sink's key in the file's sinks section; "" for the one
	// sink of a sink section.
	Name string
	Sink Sink
}

// lanes picks the publisher of a message's sink. Each sink has a
// publisher of its own (per-aggregate order, retries, dead letters,
// parking) over the relay's one tracker, which counts every sink's
// messages apart (tracker.sinkProgress) and all of them together (the
// watermark the slot is confirmed to, which is then the lowest of the
// sinks' own). Immutable once built.
type lanes struct {
	all    []*publisher
	byName map[string]*publisher // nil with one sink
}

func newLanes(ps []*publisher) lanes {
	l := lanes{all: ps}
	if len(ps) > 1 {
		l.byName = make(map[string]*publisher, len(ps))
		for _, p := range ps {
			l.byName[p.name] = p
		}
	}
	return l
}

// of returns the publisher of m's sink and records its name in m. A
// message that names no sink (a row no route took: dead-lettered) goes to
// the first. A name no sink has is refused when the configuration loads;
// should one get here, the message goes to the first sink's dead letters
// rather than anywhere else.
func (l lanes) of(m *Message) (*publisher, error) {
	if l.byName == nil {
		return l.all[0], nil
	}
	if m.Sink == "" {
		m.Sink = l.all[0].name
		return l.all[0], nil
	}
	if p, ok := l.byName[m.Sink]; ok {
		return p, nil
	}
	err := fmt.Errorf("route %s names sink %q, which is not in sinks", m.Route, m.Sink)
	m.Sink = l.all[0].name
	return l.all[0], err
}

// runLane starts the goroutines of one sink's publisher in g: the sink's
// own Run when it is a Runner, the retry loop and the publish loop.
func (r *Relay) runLane(sinkCtx, gctx context.Context, g *errgroup.Group, p *publisher) {
	if runner, ok := p.sink.(Runner); ok {
		g.Go(func() error {
			err := runner.Run(gctx)
			if err != nil && sinkCtx.Err() == nil {
				if p.name != "" {
					err = fmt.Errorf("sink %s: %w", p.name, err)
				} else {
					err = fmt.Errorf("sink: %w", err)
				}
				r.failure.fail(err)
			}
			return nil
		})
	}
	g.Go(func() error {
		p.retries.run(sinkCtx, p.publishAgain)
		return nil
	})
	g.Go(func() error {
		p.run(sinkCtx)
		return nil
	})
	if p.spill != nil {
		g.Go(func() error {
			p.spill.run(sinkCtx)
			return nil
		})
	}
}

// retrying reports whether some message of p waits to be published again
// or to be stored as a dead letter.
func (p *publisher) retrying() bool { return p.retries.waiting.Load() > 0 || p.storing.Load() > 0 }

// SinkState is one sink's own progress, as Relay.Sinks reports it.
type SinkState struct {
	// Name is the sink's name ("" for the one sink of a sink section).
	Name string
	// Confirmed is the sink's own watermark: the end of the newest
	// transaction before which the broker acknowledged (or the relay
	// dead-lettered or parked) every one of this sink's messages. The
	// slot is confirmed to the lowest of all sinks' watermarks.
	Confirmed cdc.LSN
	// LagSince is the commit time of the sink's oldest message the broker
	// has not acknowledged, or, when it has none, of the newest
	// transaction the relay saw (see Relay.LagSince).
	LagSince time.Time
	// Ready is the sink's own Ready; Retrying is as Relay.Retrying, for
	// this sink's messages.
	Ready, Retrying bool
	// Unanswered and Held are as Relay.Unanswered, for this sink.
	Unanswered time.Duration
	Held       int
	// Behind says the sink fell behind the others and its messages go to
	// the spill store (Config.Behind BehindSpill) since BehindSince;
	// Spilled is how many of its messages the store holds.
	Behind      bool
	BehindSince time.Time
	Spilled     int64
}

// Sinks returns each sink's own progress, in the order NewSinks got them.
// Safe for concurrent use.
func (r *Relay) Sinks() []SinkState {
	out := make([]SinkState, 0, len(r.lanes))
	for _, p := range r.lanes {
		lsn, since := r.tracker.sinkProgress(p.lane)
		d, n := p.unanswered()
		behind, behindSince, spilled := p.spill.state()
		if heldLSN, heldSince := p.spill.heldFrom(); spilled > 0 && heldLSN != 0 {
			// The store holds messages older than the sink's own
			// watermark says: it has not taken them yet.
			lsn = min(lsn, heldLSN-1)
			if !heldSince.IsZero() && heldSince.Before(since) {
				since = heldSince
			}
		}
		out = append(out, SinkState{Name: p.name, Confirmed: lsn, LagSince: since,
			Ready: p.sink.Ready(), Retrying: p.retrying(), Unanswered: d, Held: n,
			Behind: behind, BehindSince: behindSince, Spilled: spilled})
	}
	return out
}
