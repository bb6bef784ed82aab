// Package dispatch is the work loop the broker runners (inbox/kafka,
// inbox/rabbitmq, inbox/nats, inbox/redis) share: a queue per aggregate,
// so that one message of an aggregate runs at a time and in arrival order
// while different aggregates run in parallel; at most MaxInFlight messages
// taken and not finished; and a drain that stops starting work and waits a
// bounded time for the running handlers.
//
// In batch mode (Config.Batch > 1) one loop takes what is queued, up to
// Batch messages of any aggregates (each aggregate's in order), and hands
// them to ProcessBatch in one call, the next batch starting when the last
// one is done: a transaction for many messages, per-aggregate order kept.
//
// It is internal to the inbox's module tree: the runner modules, whose
// import paths lie under inbox/, import it; nothing else can.
package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Config configures a Dispatcher over messages of type T.
type Config[T any] struct {
	// MaxInFlight bounds the messages taken and not finished.
	MaxInFlight int
	// Batch > 1 selects batch mode: ProcessBatch gets up to Batch
	// messages at a time. 0 or 1: Process gets one.
	Batch int
	// Process runs one message to a durable outcome and acknowledges it
	// (true), or gives up because its work was abandoned (false): the
	// messages after it of its aggregate are then dropped, not started.
	Process func(m T) bool
	// ProcessBatch runs ms (an aggregate's messages in order) and reports,
	// per message, what Process would. Required in batch mode.
	ProcessBatch func(ms []T) []bool
	// Group, optional, splits batches: one batch holds only messages
	// whose Group is the same (Kafka: one partition, so that a revoke
	// abandons only the revoked partition's batch).
	Group func(m T) string
	// Skip, optional, reports that m must not start (its work was given
	// up: a revoked partition); it is dropped with its aggregate's rest.
	Skip func(m T) bool
	// Done, optional, is told that m finished (ok) or was abandoned.
	Done func(m T, ok bool)
	// Dropped, optional, is told of messages dropped before they started.
	Dropped func(ms []T)
}

// Dispatcher runs taken messages; see the package comment.
type Dispatcher[T any] struct {
	cfg      Config[T]
	mu       sync.Mutex
	cond     *sync.Cond // signalled when inflight falls, a batch is due or on stop
	queues   map[string][]T
	order    []string // batch mode: the aggregates with queued messages, oldest first
	busy     map[string]bool
	inflight int
	stopping bool
	workers  sync.WaitGroup
}

// New returns a Dispatcher; in batch mode it starts the batch loop.
func New[T any](cfg Config[T]) *Dispatcher[T] {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 1
	}
	d := &Dispatcher[T]{cfg: cfg, queues: map[string][]T{}, busy: map[string]bool{}}
	d.cond = sync.NewCond(&d.mu)
	if cfg.Batch > 1 {
		d.workers.Add(1)
		go d.batches()
	}
	return d
}

// Wait blocks while MaxInFlight messages are unfinished and returns the
// room left; 0 when ctx ended.
func (d *Dispatcher[T]) Wait(ctx context.Context) int {
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.inflight >= d.cfg.MaxInFlight && ctx.Err() == nil {
		d.cond.Wait()
	}
	if ctx.Err() != nil {
		return 0
	}
	return d.cfg.MaxInFlight - d.inflight
}

// Take queues m behind the unfinished messages of aggregate key. Call Wait
// first to keep within MaxInFlight. After Drain, m is dropped.
func (d *Dispatcher[T]) Take(key string, m T) {
	d.mu.Lock()
	if d.stopping {
		d.mu.Unlock()
		if d.cfg.Dropped != nil {
			d.cfg.Dropped([]T{m})
		}
		return
	}
	q, queued := d.queues[key]
	d.queues[key] = append(q, m)
	d.inflight++
	if d.cfg.Batch > 1 {
		if !queued {
			d.order = append(d.order, key)
		}
		d.cond.Broadcast()
		d.mu.Unlock()
		return
	}
	if !d.busy[key] {
		d.busy[key] = true
		d.workers.Add(1)
		go d.work(key)
	}
	d.mu.Unlock()
}

// work runs the queue of one aggregate until it is empty.
func (d *Dispatcher[T]) work(key string) {
	defer d.workers.Done()
	for {
		d.mu.Lock()
		q := d.queues[key]
		if len(q) == 0 || d.stopping {
			d.dropLocked(key)
			return
		}
		m := q[0]
		d.queues[key] = q[1:]
		d.mu.Unlock()

		ok := !(d.cfg.Skip != nil && d.cfg.Skip(m))
		if !ok {
			d.drop([]T{m})
		} else {
			ok = d.cfg.Process(m)
			d.done(m, ok)
		}

		if !ok {
			// Abandoned: nothing after it of this aggregate may run.
			d.mu.Lock()
			d.dropLocked(key)
			return
		}
	}
}

// dropLocked drops what is queued for key and ends its worker's turn; it
// unlocks d.mu.
func (d *Dispatcher[T]) dropLocked(key string) {
	q := d.queues[key]
	delete(d.queues, key)
	delete(d.busy, key)
	d.mu.Unlock()
	if len(q) > 0 {
		d.drop(q)
	}
}

func (d *Dispatcher[T]) drop(ms []T) {
	if d.cfg.Dropped != nil {
		d.cfg.Dropped(ms)
	}
	d.release(len(ms))
}

func (d *Dispatcher[T]) done(m T, ok bool) {
	if d.cfg.Done != nil {
		d.cfg.Done(m, ok)
	}
	d.release(1)
}

func (d *Dispatcher[T]) release(n int) {
	d.mu.Lock()
	d.inflight -= n
	d.cond.Broadcast()
	d.mu.Unlock()
}

// batches is batch mode's loop: it takes what is queued, up to Batch
// messages, runs them in one ProcessBatch call, and starts over.
func (d *Dispatcher[T]) batches() {
	defer d.workers.Done()
	for {
		d.mu.Lock()
		for len(d.order) == 0 && !d.stopping {
			d.cond.Wait()
		}
		if d.stopping {
			var rest []T
			for _, k := range d.order {
				rest = append(rest, d.queues[k]...)
				delete(d.queues, k)
			}
			d.order = nil
			d.mu.Unlock()
			if len(rest) > 0 {
				d.drop(rest)
			}
			return
		}
		var batch []T
		var keys []string // of batch's messages
		group := ""
		if d.cfg.Group != nil {
			group = d.cfg.Group(d.queues[d.order[0]][0])
		}
		left := d.order[:0:0]
		for i, k := range d.order {
			q := d.queues[k]
			if len(batch) == d.cfg.Batch || (d.cfg.Group != nil && d.cfg.Group(q[0]) != group) {
				left = append(left, d.order[i])
				continue
			}
			n := min(len(q), d.cfg.Batch-len(batch))
			batch = append(batch, q[:n]...)
			for range n {
				keys = append(keys, k)
			}
			if n == len(q) {
				delete(d.queues, k)
			} else {
				d.queues[k] = q[n:] // the aggregate's rest goes in a next batch
				left = append(left, k)
			}
		}
		d.order = left
		d.mu.Unlock()

		var skipped []T
		run, runKeys := batch[:0:0], keys[:0:0]
		for i, m := range batch {
			if d.cfg.Skip != nil && d.cfg.Skip(m) {
				skipped = append(skipped, m)
				continue
			}
			run, runKeys = append(run, m), append(runKeys, keys[i])
		}
		if len(skipped) > 0 {
			d.drop(skipped)
		}
		if len(run) == 0 {
			continue
		}
		oks := d.cfg.ProcessBatch(run)
		abandoned := map[string]bool{}
		for i, m := range run {
			ok := i < len(oks) && oks[i] && !abandoned[runKeys[i]]
			if !ok {
				abandoned[runKeys[i]] = true
			}
			d.done(m, ok)
		}
		if len(abandoned) > 0 {
			// Nothing after an abandoned message of its aggregate may run.
			d.mu.Lock()
			var rest []T
			for k := range abandoned {
				if q, ok := d.queues[k]; ok {
					rest = append(rest, q...)
					delete(d.queues, k)
					for i, o := range d.order {
						if o == k {
							d.order = append(d.order[:i:i], d.order[i+1:]...)
							break
						}
					}
				}
			}
			d.mu.Unlock()
			if len(rest) > 0 {
				d.drop(rest)
			}
		}
	}
}

// Drain stops starting work (what is queued is dropped), waits up to
// timeout for the running handlers and reports whether they all finished.
// The caller then ends their work (cancels its context) and calls Close.
func (d *Dispatcher[T]) Drain(timeout time.Duration) bool {
	timer := time.AfterFunc(timeout, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(timeout)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopping = true
	d.cond.Broadcast()
	for d.inflight > 0 && time.Now().Before(deadline) {
		d.cond.Wait()
	}
	return d.inflight == 0
}

// Close stops starting work and waits for every worker to return: call it
// after the work's context was cancelled.
func (d *Dispatcher[T]) Close() {
	d.mu.Lock()
	d.stopping = true
	d.cond.Broadcast()
	d.mu.Unlock()
	d.workers.Wait()
}

// Retry calls try until it succeeds (true) or ctx ends (false), waiting
// between calls from 100ms, doubling up to 10s, and logging each failure:
// the database failed, and the inbox's calls are idempotent.
func Retry(ctx context.Context, log *slog.Logger, what string, try func() error) bool {
	wait := 100 * time.Millisecond
	for {
		err := try()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		log.Warn(what+": processing failed, retrying", "error", err, "wait", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}
