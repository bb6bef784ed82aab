package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

// Spill stores the messages of a sink that fell behind the others
// (Config.Behind BehindSpill), so that neither the stream, nor the other
// sinks, nor the slot waits for it. Each method returns only once what it
// changed is committed. Implementations must be safe for concurrent use.
type Spill interface {
	// Add stores ms for the sink named sink, in their order, after every
	// message it stored for that sink before, and returns their Seqs, in
	// the same order.
	Add(ctx context.Context, sink string, ms []*Message) ([]int64, error)
	// Read returns up to n of the sink's stored messages whose Seq is
	// greater than after, in the order Add stored them.
	Read(ctx context.Context, sink string, after int64, n int) ([]Spilled, error)
	// Delete removes the sink's stored messages with the given Seqs.
	Delete(ctx context.Context, sink string, seqs []int64) error
	// Count returns how many messages the sink has stored.
	Count(ctx context.Context, sink string) (int64, error)
	// Trim deletes the sink's stored messages whose transaction committed
	// at or after from, and returns how many it deleted.
	Trim(ctx context.Context, sink string, from pglogrepl.LSN) (int64, error)
}

// Spilled is a message a Spill store holds, with its place in the
// store's order.
type Spilled struct {
	Seq     int64
	Message *Message
}

// spillTick is how often a sink that is behind is offered its stored
// messages again, and delivered ones are deleted from the store.
const spillTick = 50 * time.Millisecond

// spillBatch bounds the messages stored in one write.
const spillBatch = 512

// spiller is the part of a sink's publisher (its lane) that keeps the
// sink from holding back the stream when it falls behind. While the sink
// holds less than its share of the in-flight bound, the stream hands its
// messages to the publish loop. Once it holds its share, the spiller is
// on: the stream hands the sink's messages to the spiller's goroutine
// (run), which stores them (Spill.Add) and then settles them for the slot
// and the window, as an acknowledgement would. It first stores a copy of
// each message the sink holds (storeHeld), so that those do not hold the
// slot either. When the sink has room
// again, run reads the stored messages back in order and hands them to
// the publish loop, which publishes them through the aggregates' order as
// any other; each is deleted from the store once settled. When run has
// read back everything stored, it turns itself off, handing the messages
// the stream gave it meanwhile to the publish loop behind the stored ones:
// the sink's messages reach it in commit order throughout.
//
// The stream goroutine calls divert; run is the spiller's own goroutine;
// delivered is called from whichever goroutine settles a message.
type spiller struct {
	p     *publisher
	store Spill
	// share and shareBytes are the sink's share of the in-flight bound.
	share      int64
	shareBytes int64
	// in carries diverted messages from the stream to run. A send happens
	// only under mu, so that run, holding mu, sees every diverted message
	// that is not stored yet in in.
	in chan *Message
	mu sync.Mutex
	on bool // mu; behind mirrors it for readers that must not wait for mu
	// since is when the sink last fell behind (mu).
	since time.Time
	// readTo is the Seq of the newest stored message read back (run's).
	readTo int64
	// stored counts the messages in the store; behind mirrors on for
	// readers that must not wait for mu.
	stored atomic.Int64
	behind atomic.Int64 // Unix nanoseconds of since while on, else 0
	loaded bool         // the store was counted (first session start)
	// oldest is the commit position and time of the oldest message stored
	// since the store last held none of the sink's (zero: unknown), which
	// the sink's own watermark and lag count from (Relay.Sinks).
	oldestMu   sync.Mutex
	oldestLSN  pglogrepl.LSN
	oldestTime time.Time
	// copyHeld asks run to store a copy of what the sink holds
	// (storeHeld), once it turned on; atSink are the Seqs of such copies
	// whose messages are not settled yet (run's).
	copyHeld atomic.Bool
	atSink   map[int64]bool
	// done holds the Seqs of stored messages settled since run last
	// deleted them (doneMu).
	doneMu sync.Mutex
	done   []int64
}

func newSpiller(p *publisher, store Spill, sinks int) *spiller {
	share := max(1, int64(p.cfg.MaxInFlight/(sinks+1)))
	return &spiller{
		p: p, store: store, share: share,
		shareBytes: max(1, p.cfg.MaxInFlightBytes/int64(sinks+1)),
		in:         make(chan *Message, share),
		atSink:     map[int64]bool{},
	}
}

// load counts what an earlier run left in the store, when the relay's
// first session starts from the slot's position from: the sink starts
// behind, and its new messages wait behind the stored ones. It first
// deletes the stored messages of the transactions the slot delivers again
// (those that committed at or after from): the stream brings them back, in
// commit order with the sink's messages the earlier run had in flight and
// stored nothing of, which may be older. What is left is older than
// anything the stream brings.
func (s *spiller) load(ctx context.Context, from pglogrepl.LSN) error {
	if s.loaded {
		return nil
	}
	trimmed, err := s.store.Trim(ctx, s.p.name, from)
	if err != nil {
		return err
	}
	n, err := s.store.Count(ctx, s.p.name)
	if err != nil {
		return err
	}
	s.loaded = true
	s.stored.Store(n)
	if first, err := s.store.Read(ctx, s.p.name, 0, 1); err == nil && len(first) == 1 {
		s.setOldest(first[0].Message.CommitLSN, first[0].Message.CommitTime)
	}
	if trimmed > 0 {
		s.p.log.Info("deleted stored messages of the sink that the slot delivers again", zap.Int64("deleted", trimmed), zap.Stringer("from", from))
	}
	if n > 0 {
		s.mu.Lock()
		s.turnOn()
		s.mu.Unlock()
		s.p.log.Warn("sink has messages stored from an earlier run while it was behind; delivering them before new ones",
			zap.Int64("spilled", n))
	}
	return nil
}

func (s *spiller) turnOn() {
	s.on, s.since = true, time.Now()
	s.behind.Store(s.since.UnixNano())
	s.copyHeld.Store(true)
}

// divert hands m to the spiller, and reports true, when the sink is
// behind or holds its share of the in-flight bound. It blocks while the
// store is slower than the stream.
func (s *spiller) divert(ctx context.Context, m *Message) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.on {
		held := s.p.held.Load()
		if held < s.share && (held == 0 || s.p.heldBytes.Load()+int64(len(m.Envelope)) <= s.shareBytes) {
			return false, nil
		}
		s.turnOn()
		unanswered, _ := s.p.unanswered()
		s.p.log.Warn("sink is behind: storing its messages in outboxrelay.spilled until it catches up; the other sinks and the slot go on",
			zap.Int64("held", held), zap.Int64("share", s.share), zap.Duration("unanswered_for", unanswered))
	}
	select {
	case s.in <- m:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// delivered records that the stored message seq was settled: run deletes
// it from the store.
func (s *spiller) delivered(seq int64) {
	s.doneMu.Lock()
	s.done = append(s.done, seq)
	s.doneMu.Unlock()
}

// run stores diverted messages, reads stored ones back when the sink has
// room, and deletes delivered ones, until ctx ends.
func (s *spiller) run(ctx context.Context) {
	tick := time.NewTicker(spillTick)
	defer tick.Stop()
	defer func() {
		// What was delivered is deleted even as the relay stops, so that a
		// restart does not deliver it again.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		s.deleteDelivered(dctx)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-s.in:
			// The copies of what the sink held go first: those messages
			// are older than every diverted one, and a restart reads the
			// store back in the order it was written.
			if s.copyHeld.Swap(false) && !s.storeHeld() {
				return
			}
			if !s.write(ctx, s.collect(m)) {
				return
			}
		case <-tick.C:
			if s.copyHeld.Swap(false) && !s.storeHeld() {
				return
			}
			s.deleteDelivered(ctx)
			if !s.readBack(ctx) {
				return
			}
		}
	}
}

// collect returns m and the diverted messages waiting behind it, up to
// spillBatch.
func (s *spiller) collect(m *Message) []*Message {
	batch := []*Message{m}
	for len(batch) < spillBatch {
		select {
		case m := <-s.in:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// write stores batch, then settles its messages for the slot and the
// window. It reports false when the relay stops first.
func (s *spiller) write(ctx context.Context, batch []*Message) bool {
	if _, ok := s.add(batch); !ok {
		return false
	}
	if s.stored.Add(int64(len(batch))) == int64(len(batch)) {
		s.setOldest(batch[0].CommitLSN, batch[0].CommitTime)
	}
	if h := s.p.cfg.Hooks.Spilled; h != nil {
		h(s.p.name, len(batch))
	}
	for _, m := range batch {
		endSpan(m, nil)
		s.p.leave(m)
	}
	return true
}

// add stores batch, retrying as dead letters are, and returns the Seqs of
// its messages. It reports false when the relay stops first.
func (s *spiller) add(batch []*Message) ([]int64, bool) {
	var seqs []int64
	ok := s.p.store(batch[0], "store the messages of a sink that is behind", "store message %s of a sink that is behind: %w",
		func(ctx context.Context) (err error) {
			seqs, err = s.store.Add(ctx, s.p.name, batch)
			return err
		})
	return seqs, ok
}

// storeHeld stores a copy of every message the sink holds (at the sink,
// waiting for a retry, or behind its aggregate's earlier one) and settles
// each for the slot and the window, as write does: the sink keeps them and
// publishes them as before, but a sink that is down no longer holds the
// slot with them. Each copy is deleted once its message is settled
// (publisher.complete); readBack leaves the copies alone meanwhile. A
// relay that stops first publishes them from the store when it starts
// again. It reports false when the relay stops first.
func (s *spiller) storeHeld() bool {
	held := s.p.heldOnes()
	if len(held) == 0 {
		return true
	}
	seqs, ok := s.add(held)
	if !ok {
		return false
	}
	if s.stored.Add(int64(len(held))) == int64(len(held)) {
		s.setOldest(held[0].CommitLSN, held[0].CommitTime)
	}
	for _, seq := range s.p.detach(held, seqs) {
		s.atSink[seq] = true
	}
	s.p.log.Info("stored a copy of the messages the sink holds, so that it does not hold the slot", zap.Int("messages", len(held)))
	return true
}

// readBack hands stored messages to the publish loop while the sink has
// room, and turns the spiller off once it has handed over every stored
// one. It reports false when the relay stops first.
func (s *spiller) readBack(ctx context.Context) bool {
	// Not under mu: the stream may hold it while it waits for room in in,
	// which only this goroutine makes.
	for s.behind.Load() != 0 {
		room := int(s.share/2 - s.p.held.Load())
		if room <= 0 || !s.p.sink.Ready() {
			return true
		}
		stored, err := s.store.Read(ctx, s.p.name, s.readTo, room)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			s.p.log.Warn("read back the messages stored while the sink was behind; retrying", zap.Error(err))
			return true
		}
		for _, sp := range stored {
			if s.atSink[sp.Seq] {
				s.readTo = sp.Seq // a copy of a message the sink holds (storeHeld)
				continue
			}
			m := sp.Message
			m.spillSeq, m.Sink = sp.Seq, s.p.name
			s.readTo = sp.Seq
			if !s.p.enqueue(ctx, m) {
				return false
			}
		}
		if len(stored) == room {
			continue // there may be more
		}
		return s.turnOff(ctx)
	}
	return true
}

// turnOff hands the diverted messages not stored yet to the publish loop,
// behind the stored ones it read back, and lets the stream hand over the
// sink's messages again. It does nothing while the stream is diverting a
// message (it holds mu): the next tick tries again.
func (s *spiller) turnOff(ctx context.Context) bool {
	if !s.mu.TryLock() {
		return true
	}
	defer s.mu.Unlock()
	for empty := false; !empty; {
		select {
		case m := <-s.in:
			if !s.p.enqueue(ctx, m) {
				return false
			}
		default:
			empty = true
		}
	}
	s.on = false
	s.behind.Store(0)
	s.p.log.Info("sink caught up: its messages come from the stream again", zap.Duration("behind_for", time.Since(s.since)))
	return true
}

// deleteDelivered deletes the stored messages settled since the last call.
func (s *spiller) deleteDelivered(ctx context.Context) {
	s.doneMu.Lock()
	seqs := s.done
	s.done = nil
	s.doneMu.Unlock()
	if len(seqs) == 0 {
		return
	}
	if err := s.store.Delete(ctx, s.p.name, seqs); err != nil {
		s.p.log.Warn("delete delivered messages from outboxrelay.spilled; retrying", zap.Int("messages", len(seqs)), zap.Error(err))
		s.doneMu.Lock()
		s.done = append(seqs, s.done...)
		s.doneMu.Unlock()
		return
	}
	for _, seq := range seqs {
		delete(s.atSink, seq)
	}
	if s.stored.Add(-int64(len(seqs))) <= 0 {
		s.setOldest(0, time.Time{})
	}
}

func (s *spiller) setOldest(lsn pglogrepl.LSN, t time.Time) {
	s.oldestMu.Lock()
	s.oldestLSN, s.oldestTime = lsn, t
	s.oldestMu.Unlock()
}

// heldFrom returns where the sink's own watermark and lag count from while the
// store holds its messages: the commit position and time of the oldest
// stored since the store last held none; zero when it holds none or they
// are unknown.
func (s *spiller) heldFrom() (pglogrepl.LSN, time.Time) {
	if s == nil {
		return 0, time.Time{}
	}
	s.oldestMu.Lock()
	defer s.oldestMu.Unlock()
	return s.oldestLSN, s.oldestTime
}

// state returns whether the sink is behind, since when, and how many of
// its messages the store holds. Safe for concurrent use.
func (s *spiller) state() (bool, time.Time, int64) {
	if s == nil {
		return false, time.Time{}, 0
	}
	b := s.behind.Load()
	if b == 0 {
		return false, time.Time{}, s.stored.Load()
	}
	return true, time.Unix(0, b), s.stored.Load()
}
