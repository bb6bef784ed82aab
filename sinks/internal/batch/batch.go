// Package batch is the sending core of the sinks that send from their own
// Run (webhook, sqs, sns): a bounded queue of published messages, a chain
// per aggregate so that an aggregate's next message is sent only once the
// one before it is answered, and workers that send the ready messages in
// batches of at most one message per aggregate.
//
// One message per aggregate per batch is what keeps per-aggregate order
// across partial failures: a batch whose entries succeed and fail
// independently (SQS SendMessageBatch, SNS PublishBatch) can then never
// deliver an aggregate's later message while an earlier one failed, and
// the failed entries alone are retried.
package batch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Send sends ms, one message of each of distinct aggregates, and returns
// one outcome per message, in order: nil (delivered), a retryable error or
// a relay.Permanent one. It is called from the Queue's workers, at most
// Options.Workers at once.
type Send func(ctx context.Context, ms []*relay.Message) []error

// Options configure a Queue.
type Options struct {
	// Name is the sink's name, for errors ("sqs").
	Name string
	// MaxInFlight bounds the messages published and not yet answered; Publish blocks
	// beyond it.
	MaxInFlight int
	// Workers is how many batches are sent at once.
	Workers int
	// MaxBatch is the most messages in one batch (1: every message alone).
	MaxBatch int
	// Linger is the longest a batch of fewer than MaxBatch messages waits
	// for more, and only while another batch is being sent or was just
	// answered (see Queue.take); 0 sends what is ready.
	Linger time.Duration
	// Send sends a batch.
	Send Send
	// Closed is the error reported for messages still queued at Close.
	Closed error
}

// Queue is the core. Create it with New; it is safe for concurrent use.
type Queue struct {
	o     Options
	slots chan struct{} // one per message queued or in flight
	ready chan *item    // aggregates' heads, ready to send

	mu     sync.Mutex            // guards chains; orders Publish against Close
	chains map[aggregate][]*item // an entry per aggregate with a message queued or in flight: the ones behind it

	// gather is held by the one worker that is filling a batch. Workers
	// that each took a ready message and lingered for more split the
	// ready messages among themselves: with as many workers as ready
	// aggregates, every batch held one message and waited out Linger.
	gather chan struct{}
	// sending counts the batches being sent; answered wakes the gatherer
	// when one is answered. A batch lingers only while another is being
	// sent, since only an answer releases the next messages of its
	// aggregates (see take). Only the gatherer starts a batch, so sending
	// only falls while it fills one.
	sending  atomic.Int32
	answered chan struct{}
	// answeredAt is when the last batch was answered (Unix nanoseconds).
	answeredAt atomic.Int64

	run *sinks.Lifecycle
}

type aggregate struct{ typ, id string }

type item struct {
	m    *relay.Message
	done func(*relay.Message, error)
	key  aggregate
}

// New returns a Queue; it starts nothing.
func New(o Options) *Queue {
	o.MaxBatch = max(o.MaxBatch, 1)
	o.Workers = max(o.Workers, 1)
	o.MaxInFlight = max(o.MaxInFlight, 1)
	return &Queue{
		o:        o,
		slots:    make(chan struct{}, o.MaxInFlight),
		ready:    make(chan *item, o.MaxInFlight),
		chains:   map[aggregate][]*item{},
		gather:   make(chan struct{}, 1),
		answered: make(chan struct{}, 1),
		run:      sinks.NewLifecycle(o.Name),
	}
}

// Lifecycle is the Queue's start and stop, for the sink's pauses
// (Lifecycle.Sleep) and Stopped.
func (q *Queue) Lifecycle() *sinks.Lifecycle { return q.run }

// Publish queues m; done is called exactly once, from a worker once m's
// batch is answered, or before Publish returns when ctx ends or the Queue
// is closed first (ctx.Err() or Options.Closed, both retryable). done must
// not block. Messages of one aggregate are sent in the order of the
// Publish calls, each once the one before has been answered.
func (q *Queue) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	if err := ctx.Err(); err != nil {
		done(m, err)
		return
	}
	select {
	case q.slots <- struct{}{}:
	case <-ctx.Done():
		done(m, ctx.Err())
		return
	case <-q.run.Quit():
		done(m, q.o.Closed)
		return
	}
	it := &item{m: m, done: done, key: aggregate{m.AggregateType, m.AggregateID}}
	q.mu.Lock()
	if q.run.Stopped() {
		q.mu.Unlock()
		<-q.slots
		done(m, q.o.Closed)
		return
	}
	waiting, busy := q.chains[it.key]
	if busy {
		q.chains[it.key] = append(waiting, it)
	} else {
		q.chains[it.key] = nil
		q.ready <- it // never blocks: the channel has room for every slot
	}
	q.mu.Unlock()
}

// Run sends the queued messages over Options.Workers workers until ctx is
// done or the Queue is closed, then returns nil. Batches in flight when
// the Queue is closed are finished first; cancelling ctx abandons them,
// reporting their messages with what Send returns. Messages still queued
// are reported by Close. Run may be called once at a time.
func (q *Queue) Run(ctx context.Context) error {
	if err := q.run.Enter(); err != nil {
		return err
	}
	defer q.run.Exit()
	var g errgroup.Group
	for range q.o.Workers {
		g.Go(func() error {
			for {
				b, ok := q.take(ctx)
				if !ok {
					return nil
				}
				q.deliver(ctx, b)
			}
		})
	}
	return g.Wait()
}

// take returns the next batch: the first ready message, then up to
// MaxBatch-1 more. One worker at a time fills a batch (gather), so the
// ready messages go into one batch instead of one each. It waits for more,
// at most Linger, only while another batch is being sent or one was just
// answered (fill): otherwise no answer can release more, and the batch goes
// at once. It returns false when ctx is done or the Queue is stopped, with
// the messages it held back in the ready channel for Close to report.
func (q *Queue) take(ctx context.Context) ([]*item, bool) {
	if q.run.Stopped() {
		return nil, false
	}
	if q.o.MaxBatch > 1 {
		select {
		case q.gather <- struct{}{}:
			defer func() { <-q.gather }()
		case <-ctx.Done():
			return nil, false
		case <-q.run.Quit():
			return nil, false
		}
	}
	var b []*item
	select {
	case it := <-q.ready:
		b = append(b, it)
	case <-ctx.Done():
		return nil, false
	case <-q.run.Quit():
		return nil, false
	}
	b = q.fill(ctx, b)
	if q.run.Stopped() {
		for _, it := range b {
			q.ready <- it // never blocks: it holds a slot
		}
		return nil, false
	}
	q.sending.Add(1)
	return b, true
}

// answerGrace is how long after an answer a batch still waits for more
// when no other batch is being sent: the answer's done callbacks release
// the next messages of its aggregates, which the caller publishes a moment
// later. Without it, a batch sent just before they arrive alternates with
// one of them alone.
const answerGrace = 2 * time.Millisecond

// fill adds ready messages to b up to MaxBatch. With a Linger, it waits
// for more while another batch is being sent, or within answerGrace of the
// last answer, and at most Linger in all.
func (q *Queue) fill(ctx context.Context, b []*item) []*item {
	if q.o.Linger <= 0 || q.o.MaxBatch <= 1 {
		return q.drain(b)
	}
	linger := time.NewTimer(q.o.Linger)
	defer linger.Stop()
	var grace *time.Timer
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		if b = q.drain(b); len(b) >= q.o.MaxBatch {
			return b
		}
		var graceC <-chan time.Time
		if q.sending.Load() == 0 {
			left := answerGrace - time.Since(time.Unix(0, q.answeredAt.Load()))
			if left <= 0 {
				return b // no answer can release more
			}
			if grace == nil {
				grace = time.NewTimer(left)
			}
			graceC = grace.C
		}
		select {
		case it := <-q.ready:
			b = append(b, it)
		case <-q.answered: // look again: was it the last batch being sent?
		case <-graceC:
			return b
		case <-linger.C:
			return b
		case <-ctx.Done():
			return b
		case <-q.run.Quit():
			return b
		}
	}
}

// drain adds the messages ready now to b, up to MaxBatch.
func (q *Queue) drain(b []*item) []*item {
	for len(b) < q.o.MaxBatch {
		select {
		case it := <-q.ready:
			b = append(b, it)
		default:
			return b
		}
	}
	return b
}

// deliver sends b, reports each message's outcome and queues the next
// message of its aggregate, or, after a retryable failure, fails the ones
// behind it so that none overtakes it.
func (q *Queue) deliver(ctx context.Context, b []*item) {
	ms := make([]*relay.Message, len(b))
	for i, it := range b {
		ms[i] = it.m
	}
	errs := q.o.Send(ctx, ms)
	if len(errs) != len(b) {
		panic(fmt.Sprintf("%s sink: Send returned %d outcomes for %d messages", q.o.Name, len(errs), len(b)))
	}
	for i, it := range b {
		q.settle(it, errs[i])
	}
	q.answeredAt.Store(time.Now().UnixNano())
	q.sending.Add(-1)
	select {
	case q.answered <- struct{}{}:
	default: // the gatherer has a wake-up pending already
	}
}

func (q *Queue) settle(it *item, err error) {
	// The aggregate's chain is settled before done reports it: a message
	// of the aggregate published from done (a caller's own retry) then
	// starts a chain of its own instead of being failed as one behind it.
	var behind []*item
	q.mu.Lock()
	waiting := q.chains[it.key]
	switch {
	case len(waiting) == 0:
		delete(q.chains, it.key)
	case err != nil && relay.Retryable(err):
		behind = waiting
		delete(q.chains, it.key)
	default:
		next := waiting[0]
		waiting[0] = nil
		q.chains[it.key] = waiting[1:]
		q.ready <- next // never blocks: next holds a slot
	}
	q.mu.Unlock()
	it.done(it.m, err)
	<-q.slots
	for _, b := range behind {
		b.done(b.m, fmt.Errorf("not sent: message %s of aggregate %s/%s before it failed: %w", it.m.ID, it.key.typ, it.key.id, err))
		<-q.slots
	}
}

// Close stops Run (after the batches in flight, if any) and reports every
// queued message with Options.Closed. Every done has been called when it
// returns. It reports false when the Queue was closed before.
func (q *Queue) Close() bool {
	if !q.run.Stop(&q.mu) {
		return false
	}
	q.mu.Lock()
	var left []*item
	for {
		select {
		case it := <-q.ready:
			left = append(left, it)
			continue
		default:
		}
		break
	}
	for _, it := range left {
		left = append(left, q.chains[it.key]...)
	}
	clear(q.chains)
	q.mu.Unlock()
	for _, it := range left {
		it.done(it.m, q.o.Closed)
		<-q.slots
	}
	return true
}
