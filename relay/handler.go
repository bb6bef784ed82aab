package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// handler is the cdc.Handler the relay gives its Source. It turns the
// stream's transactions into messages (Builder), counts each in the
// in-flight window and under its transaction in the tracker, and submits
// it to the publisher. Its goroutine is the stream goroutine, from which
// the Source calls every method but Confirmed and Unacknowledged, which
// are safe for concurrent use.
type handler struct {
	cfg     *settings
	log     *zap.Logger
	failure *failure
	build   *Builder
	pub     *publisher // the first sink's: exactly once has only it
	lanes   lanes      // every sink's publisher
	cp      *checkpointer
	window  *window
	tracker *tracker
	tx      *txn           // the open transaction's tracker entry
	seq     *atomic.Uint64 // publish order, shared with the publishers (publisher.enqueue)
	// batch is set when the sink is Transactional (see txnBatch).
	batch *txnBatch
}

var _ cdc.Handler = (*handler)(nil)

// Start implements cdc.Handler.
func (h *handler) Start(ctx context.Context, slotConfirmed cdc.LSN) error {
	if err := h.cp.resume(ctx, slotConfirmed); err != nil {
		return err
	}
	// Another relay on the slot (a standby taking over) or an earlier run
	// may have parked aggregates: know them before the first message.
	for _, p := range h.lanes.all {
		if err := p.loadHeads(ctx); err != nil {
			return err
		}
		if p.spill != nil {
			if err := p.spill.load(ctx, slotConfirmed); err != nil {
				return fmt.Errorf("sink %s: count the messages stored while it was behind: %w", p.name, err)
			}
		}
	}
	if h.batch != nil {
		if err := h.settleSink(ctx); err != nil {
			return err
		}
	}
	h.cp.started(slotConfirmed)
	return nil
}

// Confirmed implements cdc.Handler (see checkpointer.confirmed).
func (h *handler) Confirmed() cdc.LSN { return h.cp.confirmed() }

// Unacknowledged implements cdc.Handler: the messages in flight, less those
// of an exactly-once transaction still being received, which are handed to
// the broker only with its commit. A reader that dropped that commit while
// the window was full waits for this to reach 0 before resuming from the
// slot; counting them, it waited for good.
func (h *handler) Unacknowledged() int {
	n, _ := h.tracker.inFlight()
	if h.batch != nil {
		n -= int(h.batch.held.Load())
	}
	return n
}

// Room implements cdc.Handler: the in-flight window's room. An exactly-once
// transaction that fills the window on its own will never get room: dispatch
// refuses it, so Room lets its next change through to fail there.
func (h *handler) Room() <-chan struct{} {
	room := h.window.full()
	if room != nil && h.batch != nil && len(h.batch.msgs) > 0 && len(h.batch.msgs) >= h.window.inFlight() {
		return nil
	}
	return room
}

// Idle implements cdc.Handler.
func (h *handler) Idle(walEnd cdc.LSN, serverTime time.Time, waiting bool) {
	h.tracker.idle(walEnd, serverTime)
	if waiting {
		h.cp.waiting()
	}
}

// Reset implements cdc.Handler. The abandoned transaction's dispatched
// messages stay in flight and are published: it keeps them, and the stream
// hands over only the transaction's later changes. An exactly-once
// transaction's messages were never handed over: they are dropped and
// received again.
func (h *handler) Reset() (kept bool) {
	h.tracker.reset()
	kept = h.batch == nil
	if h.batch != nil {
		h.batch.drop(h.pub.complete)
	}
	h.tx = nil
	h.build.reset()
	return kept
}

// Drain implements cdc.Handler. Whatever happens, it records the position
// reached so far before it returns.
func (h *handler) Drain(ctx context.Context) error {
	if h.cfg.Checkpoint != nil {
		// Not bound by ctx, which may have expired: record has its own timeout.
		defer func() { _ = h.cp.record(context.WithoutCancel(ctx)) }()
	}
	for {
		n, drained := h.tracker.inFlight()
		if n == 0 {
			return nil
		}
		h.log.Info("draining", zap.Int("inflight", n))
		select {
		case <-drained:
		case <-h.failure.done:
			return h.failure.err
		case <-ctx.Done():
			return fmt.Errorf("%d messages still unacknowledged: %w", n, ctx.Err())
		}
	}
}

// Begin implements cdc.Handler.
func (h *handler) Begin(ctx context.Context, b cdc.Begin) error {
	if h.batch != nil && !h.batch.positionKnown {
		if err := h.resumeFromSink(ctx); err != nil {
			return err
		}
	}
	h.build.begin(b)
	h.tx = h.tracker.beginAt(b.CommitTime)
	if h.batch != nil {
		h.batch.commitLSN = b.FinalLSN
		h.batch.skipping = b.FinalLSN <= h.batch.skipTo
	}
	return nil
}

// Commit implements cdc.Handler.
func (h *handler) Commit(ctx context.Context, c cdc.Commit) error {
	if h.batch != nil {
		h.batch.end(ctx, h.pub)
	}
	h.tracker.commit(c.EndLSN)
	h.tx = nil
	return nil
}

// Insert implements cdc.Handler.
func (h *handler) Insert(ctx context.Context, ins *cdc.Insert) error {
	mp, err := h.build.mapping(ctx, ins.Relation)
	if err != nil {
		return err
	}
	if mp.skip {
		h.tracker.carry(h.tx)
		if hook := h.cfg.Hooks.Skipped; hook != nil {
			hook(ins.Relation.QualifiedName())
		}
		return nil
	}
	ms, buildErr := h.build.buildRows(mp, ins)
	return h.dispatchAll(ctx, ms, buildErr)
}

// dispatchAll dispatches the messages of one row or logical message. A
// message the rules filter is counted and never published: it holds no
// slot, so its position is confirmed with its transaction's.
func (h *handler) dispatchAll(ctx context.Context, ms []*Message, buildErr error) error {
	for _, m := range ms {
		if m.Filtered != "" {
			h.tracker.carry(h.tx)
			if hook := h.cfg.Hooks.Filtered; hook != nil {
				hook(m.Filtered)
			}
			continue
		}
		if err := h.dispatch(ctx, m, buildErr); err != nil {
			return err
		}
	}
	return nil
}

// Message implements cdc.Handler.
func (h *handler) Message(ctx context.Context, lm *cdc.LogicalMessage) error {
	if lm.Prefix != h.cfg.MessagePrefix {
		return nil // heartbeats and other tools' messages
	}
	if !lm.Transactional && h.tx == nil {
		// Not tied to a transaction: track it on its own. It never moves the
		// watermark itself (end 0), but holds back later positions until acked.
		h.tx = h.tracker.begin()
		defer func() {
			h.tracker.commit(0)
			h.tx = nil
		}()
	}
	// A non-transactional message inside an open transaction (pgoutput
	// without streaming never interleaves them, but a decoder that did must
	// not break the watermark) is counted with that transaction: opening a
	// tracker entry of its own would end the open one, whose commit would
	// then find nothing to close, and the watermark would stop for good.
	ms, buildErr := h.build.buildEmitted(lm)
	if !lm.Transactional && buildErr == nil {
		// PostgreSQL decodes a non-transactional message at once, whether its
		// transaction commits or not: publishing it could publish a rolled-back
		// event, ahead of its transaction.
		buildErr = errors.New("non-transactional logical decoding message: it may belong to a rolled-back transaction; emit with pg_logical_emit_message(true, ...)")
	}
	return h.dispatchAll(ctx, ms, buildErr)
}

// dispatch counts m in flight and submits it to the publisher. An invalid
// message is dead-lettered at once: it is never published, so it holds
// nothing back.
func (h *handler) dispatch(ctx context.Context, m *Message, buildErr error) error {
	if h.tx == nil {
		return errors.New("change outside a transaction")
	}
	if h.batch != nil {
		if h.batch.skipping {
			h.tracker.carry(h.tx)
			return nil // committed in the broker already
		}
		if err := h.batch.fits(len(m.Envelope), h.cfg); err != nil {
			// No acknowledgement can make room for it, and a stop must not
			// hide it: fail now. Its messages were never handed over, so
			// they hold nothing in flight.
			h.batch.drop(h.pub.complete)
			endSpan(m, err)
			h.failure.fail(err)
			return err
		}
	}
	pub, routeErr := h.lanes.of(m)
	if buildErr == nil {
		buildErr = routeErr
	}
	if err := h.window.acquire(ctx, len(m.Envelope)); err != nil {
		return err
	}
	m.tx = h.tx
	m.seq = h.seq.Add(1)
	h.tracker.add(h.tx, pub.lane)
	if buildErr != nil {
		m.Attempts = 1
		m.FirstFailure = time.Now()
		m.LastFailure = m.FirstFailure
		m.LastError = fmt.Errorf("%w: %w", ErrInvalid, buildErr)
		pub.deadLetter(m, false)
		return nil
	}
	if h.batch != nil {
		h.batch.msgs = append(h.batch.msgs, m)
		h.batch.bytes += len(m.Envelope)
		h.batch.held.Add(1)
		return nil
	}
	return pub.accept(ctx, m)
}
