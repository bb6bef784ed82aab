package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// txnBatch is the handler's state for a Transactional sink (exactly-once):
// the received messages of the open source transaction, handed over only
// once it has been received in full, and the position the broker holds,
// at or below which nothing is sent again. Stream goroutine only.
type txnBatch struct {
	sink Transactional
	msgs []*Message
	// bytes is the size of msgs' envelopes.
	bytes int
	// held is len(msgs), for Unacknowledged, which may be called from
	// any goroutine: msgs are counted in flight but not handed over.
	held atomic.Int64
	// commitLSN is the open transaction's commit position.
	commitLSN cdc.LSN
	// skipTo is the position the broker holds; skipping says the open
	// transaction is at or below it.
	skipTo   cdc.LSN
	skipping bool
	// positionKnown: skipTo was read in this session.
	positionKnown bool
}

// end publishes the transaction's messages and ends it in the sink.
func (t *txnBatch) end(ctx context.Context, p *publisher) {
	if len(t.msgs) > 0 {
		t.held.Store(0)
		for _, m := range t.msgs {
			p.publish(ctx, m)
		}
		clear(t.msgs)
		t.msgs, t.bytes = t.msgs[:0], 0
		// A dead letter of this transaction must be stored before the
		// broker's position passes it.
		p.deadLetters.Wait()
		t.sink.EndTxn(t.commitLSN)
	}
	t.skipping = false
}

// drop abandons the open transaction, passing each of its messages to
// complete.
func (t *txnBatch) drop(complete func(*Message)) {
	t.held.Store(0)
	for _, m := range t.msgs {
		complete(m)
	}
	clear(t.msgs)
	t.msgs, t.bytes = t.msgs[:0], 0
	t.skipping = false
}

// fits reports, as the error that stops the relay, a message of size that
// would take the open transaction past what the in-flight window holds: the
// window frees room only as transactions are handed over, so the
// transaction could never be received in full.
func (t *txnBatch) fits(size int, cfg *settings) error {
	if len(t.msgs) >= cfg.MaxInFlight {
		return fmt.Errorf("the transaction that commits at %s has more than %d outbox rows and exactly-once mode publishes whole transactions; raise relay.max_inflight above the largest transaction", t.commitLSN, cfg.MaxInFlight)
	}
	if len(t.msgs) > 0 && int64(t.bytes+size) > cfg.MaxInFlightBytes {
		return fmt.Errorf("the transaction that commits at %s has more than %d bytes of outbox messages and exactly-once mode publishes whole transactions; raise relay.max_inflight_bytes above the largest transaction", t.commitLSN, cfg.MaxInFlightBytes)
	}
	return nil
}

// settleSink waits until everything handed to the transactional sink is
// settled (a session that ended leaves batches committing), and has the
// position read again before the first transaction of the session.
func (h *handler) settleSink(ctx context.Context) error {
	for {
		n, drained := h.tracker.inFlight()
		if n == 0 {
			break
		}
		select {
		case <-drained:
		case <-h.failure.done:
			return h.failure.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	h.batch.positionKnown = false
	return nil
}

// resumeFromSink reads the position the broker holds: what is at or below
// it is not sent again. It runs at the session's first transaction, not in
// Start: a standby calls Start before every attempt to take the slot, and
// reading the position fences off the relay that holds it.
func (h *handler) resumeFromSink(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		pos, err := h.batch.sink.Position(ctx)
		if err == nil {
			h.batch.skipTo, h.batch.positionKnown = pos, true
			h.log.Info("exactly-once: resuming after the position committed in the broker", zap.Stringer("position", pos))
			return nil
		}
		wait := h.pub.backoff(attempt)
		h.log.Warn("read the position committed in the broker; retrying", zap.Duration("retry_in", wait), zap.Error(err))
		select {
		case <-time.After(wait):
		case <-h.failure.done:
			return h.failure.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
