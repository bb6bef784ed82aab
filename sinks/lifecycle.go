package sinks

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Lifecycle is the start and stop of a sink that sends from its own Run
// (a relay.Runner: the NATS, Redis, RabbitMQ, webhook and Kafka
// transactional sinks): one Run at a time,
// and Close ends it and waits until it has returned. Create it with
// NewLifecycle; it is safe for concurrent use.
type Lifecycle struct {
	name string
	quit chan struct{}
	run  sync.Mutex // held while Run runs
}

// NewLifecycle returns the lifecycle of the sink called name ("nats"),
// which names it in errors.
func NewLifecycle(name string) *Lifecycle {
	return &Lifecycle{name: name, quit: make(chan struct{})}
}

// Enter is called first by the sink's Run: it fails when Run is running
// already. The caller calls Exit when Run returns.
func (l *Lifecycle) Enter() error {
	if !l.run.TryLock() {
		return fmt.Errorf("%s sink: Run called twice", l.name)
	}
	return nil
}

// Exit is called by Run as it returns, after a successful Enter.
func (l *Lifecycle) Exit() { l.run.Unlock() }

// Stop is called first by the sink's Close. It closes Quit while holding
// lock, the sink's lock that orders Publish against Close (a Publish that
// holds it and sees Stopped false may still queue its message), then
// waits until Run has returned, when it runs; a Run called later sees Quit
// closed and returns at once. It reports false, at once, when the sink was stopped
// before: Close is idempotent.
func (l *Lifecycle) Stop(lock sync.Locker) bool {
	lock.Lock()
	if l.Stopped() {
		lock.Unlock()
		return false
	}
	close(l.quit)
	lock.Unlock()
	l.run.Lock() // Run has returned, or was never called
	//lint:ignore SA2001 a barrier, not a critical section: Run holds run while it runs
	l.run.Unlock()
	return true
}

// Context returns a context of ctx that is cancelled, too, when Stop is
// called: the context of the work of Run. Run calls cancel as it returns.
func (l *Lifecycle) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-l.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Quit is closed by Stop.
func (l *Lifecycle) Quit() <-chan struct{} { return l.quit }

// Stopped reports whether Stop has been called. It does not block.
func (l *Lifecycle) Stopped() bool {
	select {
	case <-l.quit:
		return true
	default:
		return false
	}
}

// Sleep waits for d and reports true, or false as soon as ctx is done or
// the sink is stopped.
func (l *Lifecycle) Sleep(ctx context.Context, d time.Duration) bool {
	return sleep(ctx, l.quit, d)
}

// Sleep waits for d and reports true, or false as soon as ctx is done: a
// sink's pause between attempts.
func Sleep(ctx context.Context, d time.Duration) bool { return sleep(ctx, nil, d) }

// sleep is Sleep that ends early, too, when quit (which may be nil) closes.
func sleep(ctx context.Context, quit <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-quit:
		return false
	}
}
