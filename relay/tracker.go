package relay

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
)

// txn is one source transaction whose messages may still be in flight.
type txn struct {
	end       pglogrepl.LSN
	pending   int
	committed bool
	// marker entries carry a keepalive position, not a transaction.
	marker bool
	// carried is set once the transaction (or one folded into it) brought
	// the relay a change: a row or a message of its own, published,
	// dead-lettered or filtered (carriedEnd).
	carried bool
	// commitTime is the source transaction's commit time (zero for markers
	// and for messages outside a transaction).
	commitTime time.Time
	// sinks counts pending per sink when the relay has several (nil with
	// one, and for markers): each sink's own watermark (sinkProgress).
	sinks []int
}

// tracker computes the flushed position: the end LSN of the newest
// transaction whose messages, and those of every earlier transaction, the
// broker has acknowledged — a contiguous low watermark. Acknowledgements may
// arrive in any order and from any goroutine. The handler opens, counts and
// commits transactions on the stream goroutine; publisher.complete acks from
// whichever goroutine settles a message; the checkpointer reads the
// watermark.
type tracker struct {
	mu        sync.Mutex
	queue     []*txn // oldest first
	open      *txn   // the transaction being received, also in queue
	pending   int    // messages not yet acknowledged, over all transactions
	confirmed atomic.Uint64
	// carriedEnd is the end of the newest carried transaction that the
	// watermark passed: the checkpointer records such a position at once,
	// and one moved only by keepalives and by transactions that brought
	// nothing (heartbeats, the relay's own checkpoint writes) at a slower
	// pace.
	carriedEnd atomic.Uint64
	drained    chan struct{} // closed and replaced when pending drops to 0
	// lastCommit is the newest commit time of the transactions passed by
	// the watermark: heartbeats keep it close to now on an idle relay.
	lastCommit time.Time
	// caughtUp is the server time of the newest keepalive received between
	// transactions: everything the walsender had sent by then was
	// received. Once it is all acknowledged there is no lag before it.
	caughtUp time.Time
	// sinks is the number of sinks when more than one: their messages are
	// also counted apart (txn.sinks). The watermark counts them all, so it
	// is the lowest of the sinks' own watermarks.
	sinks int
}

func newTracker() *tracker {
	return &tracker{drained: make(chan struct{})}
}

// newSinksTracker returns a tracker that also follows each of n sinks' own
// watermark (sinkProgress).
func newSinksTracker(n int) *tracker {
	t := newTracker()
	if n > 1 {
		t.sinks = n
	}
	return t
}

// Confirmed is safe for concurrent use.
func (t *tracker) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(t.confirmed.Load()) }

// Carried returns the end of the newest transaction that brought the relay
// a change and that the watermark passed (at or below Confirmed). Safe for
// concurrent use.
func (t *tracker) Carried() pglogrepl.LSN { return pglogrepl.LSN(t.carriedEnd.Load()) }

func (t *tracker) begin() *txn { return t.beginAt(time.Time{}) }

// beginAt opens a transaction that committed at commitTime.
func (t *tracker) beginAt(commitTime time.Time) *txn {
	tx := &txn{commitTime: commitTime}
	if t.sinks > 0 {
		tx.sinks = make([]int, t.sinks)
	}
	t.mu.Lock()
	t.queue = append(t.queue, tx)
	t.open = tx
	t.mu.Unlock()
	return tx
}

// add counts one more message in flight for tx, bound for the sink with
// index sink.
func (t *tracker) add(tx *txn, sink int) {
	t.mu.Lock()
	tx.pending++
	tx.carried = true
	t.pending++
	if tx.sinks != nil {
		tx.sinks[sink]++
	}
	t.mu.Unlock()
}

// carry records that tx brought the relay a change that holds nothing in
// flight (a row the rules filtered, a row of a table it skips, a
// transaction already in the broker): passing it is worth recording at
// once, as passing one with messages is.
func (t *tracker) carry(tx *txn) {
	if tx == nil {
		return
	}
	t.mu.Lock()
	tx.carried = true
	t.mu.Unlock()
}

// commit records the end of the open transaction.
func (t *tracker) commit(end pglogrepl.LSN) {
	t.mu.Lock()
	if tx := t.open; tx != nil {
		tx.end = end
		tx.committed = true
		t.open = nil
		// A transaction with nothing in flight behind a stuck one is folded
		// into its complete predecessor, so that the thousands of empty
		// transactions pgoutput may send (PostgreSQL 14) do not pile up.
		if n := len(t.queue); tx.pending == 0 && n >= 2 && t.queue[n-1] == tx {
			if prev := t.queue[n-2]; prev.committed && prev.pending == 0 {
				prev.end = max(prev.end, end)
				prev.carried = prev.carried || tx.carried
				if tx.commitTime.After(prev.commitTime) {
					prev.commitTime = tx.commitTime
				}
				prev.marker = true
				t.queue[n-1] = nil
				t.queue = t.queue[:n-1]
			}
		}
	}
	t.advanceLocked()
	t.mu.Unlock()
}

// ack records that one message of tx, bound for the sink with index sink,
// was acknowledged (or dead-lettered).
func (t *tracker) ack(tx *txn, sink int) {
	t.mu.Lock()
	tx.pending--
	t.pending--
	if tx.sinks != nil {
		tx.sinks[sink]--
	}
	if t.pending == 0 {
		close(t.drained)
		t.drained = make(chan struct{})
	}
	if tx == t.queue[0] {
		t.advanceLocked()
	}
	t.mu.Unlock()
}

// idle records that every transaction committed before walEnd has been
// received. The position is confirmed once everything before it is acknowledged.
func (t *tracker) idle(walEnd pglogrepl.LSN, serverTime time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open != nil {
		return
	}
	if serverTime.After(t.caughtUp) {
		t.caughtUp = serverTime
	}
	if len(t.queue) == 0 {
		t.raiseLocked(walEnd)
		return
	}
	if last := t.queue[len(t.queue)-1]; last.marker {
		last.end = max(last.end, walEnd)
		return
	}
	t.queue = append(t.queue, &txn{end: walEnd, committed: true, marker: true})
}

// reset abandons the open transaction: it will be received again, and its
// end comes with it, so it must not advance the watermark. Its messages in
// flight still hold the watermark back until they are acknowledged: the
// stream does not hand them over again (cdc.Handler.Reset).
func (t *tracker) reset() {
	t.mu.Lock()
	if tx := t.open; tx != nil {
		tx.committed = true
		tx.end = 0
		t.open = nil
	}
	t.advanceLocked()
	t.mu.Unlock()
}

func (t *tracker) advanceLocked() {
	i := 0
	for ; i < len(t.queue); i++ {
		tx := t.queue[i]
		if !tx.committed || tx.pending > 0 {
			break
		}
		t.raiseLocked(tx.end)
		if tx.carried && uint64(tx.end) > t.carriedEnd.Load() {
			t.carriedEnd.Store(uint64(tx.end))
		}
		// An abandoned transaction (end 0) will be received again: it
		// says nothing about what was delivered.
		if tx.end != 0 && tx.commitTime.After(t.lastCommit) {
			t.lastCommit = tx.commitTime
		}
	}
	if i > 0 {
		n := copy(t.queue, t.queue[i:])
		clear(t.queue[n:])
		t.queue = t.queue[:n]
	}
}

func (t *tracker) raiseLocked(lsn pglogrepl.LSN) {
	if uint64(lsn) > t.confirmed.Load() {
		t.confirmed.Store(uint64(lsn))
	}
}

// inFlight returns the number of unacknowledged messages and a channel
// closed when that number next drops to zero.
func (t *tracker) inFlight() (int, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending, t.drained
}

// lagSince returns the commit time lag counts from: that of the oldest
// transaction with a message the broker has not acknowledged or that is
// still being received, or, when none is, the newer of the newest commit
// passed by the watermark and the last keepalive between transactions
// (caughtUp): an idle relay that is caught up has no lag, whatever the
// heartbeat interval. Zero until either is known.
func (t *tracker) lagSince() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tx := range t.queue {
		if !tx.committed || tx.pending > 0 {
			if !tx.commitTime.IsZero() {
				return tx.commitTime
			}
			return t.lastCommit
		}
	}
	return latest(t.lastCommit, t.caughtUp)
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sinkProgress returns the own watermark of the sink with index sink (the
// end of the newest transaction before which every one of that sink's
// messages is settled, whatever the other sinks hold) and the commit time
// its lag counts from, as lagSince does for all sinks. With one sink they
// are Confirmed and lagSince.
func (t *tracker) sinkProgress(sink int) (pglogrepl.LSN, time.Time) {
	if t.sinks == 0 {
		return t.Confirmed(), t.lagSince()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w, last := t.Confirmed(), t.lastCommit
	for _, tx := range t.queue {
		if !tx.committed || (tx.sinks != nil && tx.sinks[sink] > 0) {
			if !tx.commitTime.IsZero() {
				return w, tx.commitTime
			}
			return w, last
		}
		w = max(w, tx.end)
		if tx.end != 0 && tx.commitTime.After(last) {
			last = tx.commitTime
		}
	}
	return w, latest(last, t.caughtUp)
}
