package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/backoff"
)

// publisher hands messages to the Sink and settles every outcome. A message
// goes to the sink only once its aggregate's previous one is settled
// (aggregates, order.go); an acknowledgement completes it and releases the
// aggregate's next message, a failure retries it (retryQueue, retry.go) or
// stores it as a dead letter, and a message of a parked aggregate is stored
// behind its dead letter instead (park.go).
//
// Its goroutine is the publish loop (run, started by Relay.Run), which
// publishes what an outcome releases: outcomes arrive through onDone on
// the sink's goroutines, which must not publish. The stream goroutine
// submits new messages, the retry loop publishes retries, and dead letters
// and parked messages are stored on background goroutines. Safe for
// concurrent use.
type publisher struct {
	cfg     *settings
	sink    Sink
	log     *zap.Logger
	failure *failure
	bg      *background
	window  *window  // shared with the handler, which acquires
	tracker *tracker // shared with the handler and the checkpointer
	order   *aggregates
	retries *retryQueue
	// ctx is the sink's context, set by Relay.Run before the first
	// message: outcomes and dead-letter stores have no caller context, and
	// its cancellation says the relay is shutting down.
	ctx  context.Context
	done func(*Message, error) // onDone, bound once rather than per Publish
	// handoff carries messages released by their aggregate's previous one
	// to the publish loop. Its capacity is more than the messages that can
	// exist, Config.MaxInFlight in the window and half a sink's share read
	// back from the spill store (spill.go), so a send never blocks.
	handoff chan handed
	// exactlyOnce: the sink is Transactional, and publishes without the
	// per-aggregate order (see Transactional).
	exactlyOnce bool
	// unordered hands every message over at once, without waiting for its
	// aggregate's previous one: the order of first deliveries is then lost
	// under failures. Config.Order OrderNone sets it, and so does
	// BenchmarkAggregateOrder, to measure what the per-aggregate order costs.
	unordered bool
	// pipe is the sink when it pipelines (Pipeliner, pipeline.go): an
	// aggregate's messages go out together, and are gated only while one
	// of them failed. nil otherwise.
	pipe       Pipeliner
	atSink     atomic.Int64 // handed to the sink, outcome not reported yet
	answeredAt atomic.Int64 // Unix nanoseconds of the sink's last outcome, or of the start of a wait
	storing    atomic.Int64 // dead letters and parked messages being stored
	// deadLetters counts dead letters being stored: an exactly-once
	// transaction is ended only once they are.
	deadLetters sync.WaitGroup
	// lane is the sink's index among the relay's sinks (sinks.go), name
	// its name ("" for the one sink of a sink section).
	lane int
	name string
	// queue, when the relay feeds several sinks, carries the stream's
	// messages to the publish loop, so that a sink whose Publish blocks
	// (waiting for a connection, say) never blocks the stream and the
	// other sinks with it. nil with one sink: the stream submits itself.
	// Its capacity is Config.MaxInFlight.
	queue chan *Message
	// held and heldBytes count the messages handed to this sink's queue
	// and not settled yet; spill, when set, stores the sink's messages
	// once they reach its share of the window (spill.go).
	held, heldBytes atomic.Int64
	spill           *spiller
	// seq numbers messages in publish order, shared with the handler.
	seq *atomic.Uint64
	// queuedMu guards queuedOnes, the messages handed to queue and not
	// complete yet, and the spillSeq of those (detach).
	queuedMu   sync.Mutex
	queuedOnes map[*Message]struct{}
}

func newPublisher(cfg *settings, sink Sink, log *zap.Logger, f *failure, bg *background, w *window, t *tracker) *publisher {
	p := &publisher{
		cfg: cfg, sink: sink, log: log, failure: f, bg: bg, window: w, tracker: t,
		order:     newAggregates(),
		retries:   newRetryQueue(),
		handoff:   make(chan handed, cfg.MaxInFlight+cfg.MaxInFlight/2+1),
		unordered: cfg.Order == OrderNone,
	}
	_, p.exactlyOnce = sink.(Transactional)
	if pl, ok := sink.(Pipeliner); ok && !p.exactlyOnce && !p.unordered && pl.Pipeline() {
		p.pipe = pl
	}
	p.done = p.onDone
	return p
}

// accept takes m from the stream: with one sink it submits m itself;
// with several it hands m to the sink's publish loop, or to the spiller
// when the sink is behind. It blocks only while a spill store is slower
// than the stream, and returns ctx's error if ctx ends first.
func (p *publisher) accept(ctx context.Context, m *Message) error {
	if p.queue == nil {
		p.submit(ctx, m)
		return nil
	}
	if p.spill != nil {
		if diverted, err := p.spill.divert(ctx, m); diverted || err != nil {
			return err
		}
	}
	if !p.enqueue(ctx, m) {
		return ctx.Err()
	}
	return nil
}

// enqueue hands m to the publish loop through queue, counting it held.
// It reports false if ctx ends first.
func (p *publisher) enqueue(ctx context.Context, m *Message) bool {
	// The queue's order is the sink's publish order: a message read back
	// from the spill store, or handed over when the spiller turns off, is
	// numbered as it enters it, after the sink's earlier ones.
	m.seq = p.seq.Add(1)
	m.queued = true
	p.queuedMu.Lock()
	p.queuedOnes[m] = struct{}{}
	p.queuedMu.Unlock()
	p.held.Add(1)
	p.heldBytes.Add(int64(len(m.Envelope)))
	select {
	case p.queue <- m:
		return true
	case <-ctx.Done():
		return false
	}
}

// submit publishes m, new from the stream, or leaves it waiting behind its
// aggregate's unsettled message (see aggregates).
func (p *publisher) submit(ctx context.Context, m *Message) {
	switch {
	case p.unordered:
		p.publish(ctx, m)
	case p.pipe != nil:
		if p.order.admitPiped(m) {
			p.send(ctx, m)
		}
	case p.order.admit(m):
		p.send(ctx, m)
	}
}

// publish hands m to the sink, counting it as awaiting the broker's answer.
func (p *publisher) publish(ctx context.Context, m *Message) {
	if p.atSink.Add(1) == 1 {
		p.answeredAt.Store(time.Now().UnixNano()) // the wait starts now
	}
	p.sink.Publish(ctx, m, p.done)
}

// unanswered returns how long the sink has held messages without
// reporting an outcome, and how many it holds (see Relay.Unanswered).
func (p *publisher) unanswered() (time.Duration, int) {
	n := p.atSink.Load()
	if n <= 0 {
		return 0, 0
	}
	return max(0, time.Since(time.Unix(0, p.answeredAt.Load()))), int(n)
}

// onDone receives every publish outcome, from any goroutine.
func (p *publisher) onDone(m *Message, err error) {
	now := time.Now() // one clock read for the answer and the hook
	p.answeredAt.Store(now.UnixNano())
	p.atSink.Add(-1)
	if err == nil {
		if h := p.cfg.Hooks.Published; h != nil {
			h(m, now)
		}
		endSpan(m, nil)
		p.settle(m, !p.exactlyOnce)
		return
	}
	if p.ctx.Err() != nil {
		// Shutting down: the message stays unconfirmed and is delivered
		// again after restart, and so do the ones held behind it.
		endSpan(m, fmt.Errorf("not acknowledged before the relay stopped: %w", err))
		return
	}
	if p.exactlyOnce {
		if Retryable(err) {
			// A batch cannot be retried message by message: the next start
			// resumes from the position the broker holds.
			p.failure.fail(fmt.Errorf("exactly-once publish of message %s: %w", m.ID, err))
			return
		}
		m.Attempts, m.Refusals, m.FirstFailure, m.LastFailure, m.LastError = 1, 1, time.Now(), time.Now(), err
		p.deadLetter(m, false)
		return
	}
	if m.Attempts == 0 {
		m.FirstFailure = now
	}
	m.Attempts++
	m.countRefusal(err)
	m.LastFailure = now
	m.LastError = err
	if h := p.cfg.Hooks.PublishFailed; h != nil {
		h(m, err)
	}
	spanFailed(m, err)
	if p.pipe != nil {
		if p.unordered { // BenchmarkAggregateOrder's reference: nothing is held
			p.pipe.Resume(m.AggregateType, m.AggregateID)
		} else if m = p.order.failedPiped(m); m == nil {
			return // the aggregate's others at the sink are reported first
		} else {
			p.pipe.Resume(m.AggregateType, m.AggregateID)
		}
	}
	p.recover(m)
}

// recover retries m, failed, or dead-letters it when the broker has
// refused it MaxAttempts times (Message.Refusals). The aggregate's later messages
// stay held until m is settled: none of them is at the sink, so none can
// arrive before m's retry.
func (p *publisher) recover(m *Message) {
	if m.refusedEnough(p.cfg.MaxAttempts) {
		p.deadLetter(m, true)
		return
	}
	p.retry(m)
}

// settle completes m and, when m was published through the per-aggregate
// order (gated), hands its aggregate's next message to the publish loop.
func (p *publisher) settle(m *Message, gated bool) {
	var next, head *Message
	var drain []*Message
	switch {
	case !gated || p.unordered:
	case p.pipe != nil:
		next, drain, head = p.order.settledPiped(m)
	default:
		next = p.order.next(m)
	}
	p.complete(m)
	if next != nil {
		p.handoff <- handed{m: next}
	}
	for i, d := range drain {
		p.handoff <- handed{m: d, drain: i == len(drain)-1}
	}
	if head != nil {
		p.pipe.Resume(head.AggregateType, head.AggregateID)
		p.recover(head)
	}
}

// run is the publish loop: it publishes (or parks) the messages released
// by settle until ctx ends.
func (p *publisher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-p.queue: // nil, so never ready, with one sink
			p.submit(ctx, m)
		case h := <-p.handoff:
			k := keyOf(h.m) // h.m may be settled, and no longer the relay's, once handed over
			p.countAgain(h.m)
			p.send(ctx, h.m)
			for more := h.drain; more; {
				// The aggregate's messages that came meanwhile go out now,
				// behind the released ones, before the stream's next.
				next := p.order.drained(k)
				for _, m := range next {
					p.send(ctx, m)
				}
				more = len(next) > 0
			}
		}
	}
}

// complete ends m's life in the relay: its room in the window is freed and
// its transaction's count in the tracker drops, which may move the
// watermark; a message read back from the spill store is deleted from it
// instead, since it left the window and the tracker when it was stored.
func (p *publisher) complete(m *Message) {
	spillSeq := m.spillSeq
	if m.queued {
		p.queuedMu.Lock()
		delete(p.queuedOnes, m)
		spillSeq = m.spillSeq // detach may have set it
		p.queuedMu.Unlock()
		p.held.Add(-1)
		p.heldBytes.Add(-int64(len(m.Envelope)))
	}
	if spillSeq != 0 {
		p.spill.delivered(spillSeq)
		return
	}
	p.leave(m)
}

// heldOnes returns the messages handed to the sink's queue that are not
// complete and have no copy in the spill store, in publish order.
func (p *publisher) heldOnes() []*Message {
	p.queuedMu.Lock()
	ms := make([]*Message, 0, len(p.queuedOnes))
	for m := range p.queuedOnes {
		if m.spillSeq == 0 && m.tx != nil {
			ms = append(ms, m)
		}
	}
	p.queuedMu.Unlock()
	slices.SortFunc(ms, func(a, b *Message) int { return cmp.Compare(a.seq, b.seq) })
	return ms
}

// detach settles ms, of which the spill store holds copies with the Seqs
// seqs, for the slot and the window, as storing them would: each copy is
// deleted once its message is complete. A message that completed
// meanwhile has its copy deleted now. It returns the Seqs of the copies
// whose messages are still held.
func (p *publisher) detach(ms []*Message, seqs []int64) []int64 {
	var held []int64
	p.queuedMu.Lock()
	defer p.queuedMu.Unlock()
	for i, m := range ms {
		if _, ok := p.queuedOnes[m]; !ok {
			p.spill.delivered(seqs[i])
			continue
		}
		m.spillSeq = seqs[i]
		p.window.release(len(m.Envelope))
		p.tracker.ack(m.tx, p.lane)
		m.tx = nil
		held = append(held, seqs[i])
	}
	return held
}

// leave frees m's room in the window and counts it settled in the tracker.
func (p *publisher) leave(m *Message) {
	p.window.release(len(m.Envelope))
	p.tracker.ack(m.tx, p.lane)
	if m.buf != nil {
		// The sink is done with m (Sink contract): reuse its buffer.
		putBuffer(m.buf, m.Envelope)
		m.Envelope, m.buf = nil, nil
	}
}

func (p *publisher) backoff(attempt int) time.Duration {
	return backoff.Delay(p.cfg.RetryMin, p.cfg.RetryMax, attempt)
}

// deadLetter stores m as a dead letter, then settles it; gated says whether
// m was published through the per-aggregate order, whose next message it
// holds back until stored. With DeadLetterPark, a gated m is stored as the
// head of its parked aggregate, and the aggregate is parked before its next
// message is released.
func (p *publisher) deadLetter(m *Message, gated bool) {
	head := gated && p.parking()
	var store func(context.Context, *Message) error
	if p.cfg.DeadLetters != nil {
		store = p.cfg.DeadLetters.Add
	}
	if head {
		store = p.cfg.Parking.AddHead
	}
	if store == nil {
		endSpan(m, m.LastError)
		p.failure.fail(fmt.Errorf("message %s to %q failed %d times and no dead-letter store is configured: %w", m.ID, m.Destination, m.Attempts, m.LastError))
		return
	}
	p.deadLetters.Add(1)
	started := p.bg.start(func() {
		defer p.deadLetters.Done()
		p.storing.Add(1) // /readyz shows a dead letter that cannot be stored yet
		defer p.storing.Add(-1)
		if !p.store(m, "store dead letter", "store dead letter for message %s: %w", func(ctx context.Context) error { return store(ctx, m) }) {
			return
		}
		p.log.Warn("dead-lettered", zap.String("message_id", m.ID), zap.String("destination", m.Destination),
			zap.Int("attempts", m.Attempts), zap.Int("refusals", m.Refusals), zap.Bool("parks_aggregate", head), zap.Error(m.LastError))
		if h := p.cfg.Hooks.DeadLettered; h != nil {
			h(m)
		}
		if head {
			p.order.park(keyOf(m))
		}
		endSpan(m, fmt.Errorf("dead-lettered after %d attempts: %w", m.Attempts, m.LastError))
		p.settle(m, gated)
	})
	if !started {
		p.deadLetters.Done()
	}
}

// store calls save until it succeeds, and reports whether it did. It gives
// up when the relay shuts down (m stays unconfirmed: it is delivered again
// after a restart) and fails the relay when an error is permanent
// (permanentStoreError). op names the store in the log; failFormat is the
// format of the error that stops the relay, given m.ID and the error.
func (p *publisher) store(m *Message, op, failFormat string, save func(ctx context.Context) error) bool {
	for attempt := 1; ; attempt++ {
		err := save(p.ctx)
		if err == nil {
			return true
		}
		if p.ctx.Err() != nil {
			return false
		}
		if permanentStoreError(err) {
			p.failure.fail(fmt.Errorf(failFormat, m.ID, err))
			return false
		}
		wait := p.backoff(attempt)
		p.log.Warn(op+" failed; retrying", zap.String("message_id", m.ID), zap.Duration("retry_in", wait), zap.Error(err))
		select {
		case <-time.After(wait):
		case <-p.ctx.Done():
			return false
		}
	}
}

// permanentStoreError reports SQLSTATE classes that retrying will not fix:
// 22 data exception, 23 integrity violation, 42 syntax or privilege.
func permanentStoreError(err error) bool {
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return false
	}
	code := coded.SQLState()
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23") || strings.HasPrefix(code, "42")
}

// handed is a message on its way to the publish loop. drain marks the
// last of an aggregate's messages released together (settledPiped): once
// it is handed over, the publish loop also hands over those that came to
// wait meanwhile.
type handed struct {
	m     *Message
	drain bool
}
