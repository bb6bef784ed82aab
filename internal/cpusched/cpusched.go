// Package cpusched sets the CPU scheduling policy of the relay's threads.
//
// The relay is a pipeline that wakes often: each message from its
// walsender wakes a reader, a publisher, the broker client and their
// callbacks, most on threads of their own. Under Linux's default policy a
// woken thread preempts the one running, so where the relay shares CPUs
// with PostgreSQL, its threads keep preempting the walsender that feeds it,
// and a walsender behind by a few milliseconds, which sends in a burst,
// falls further behind with every message it sends. SCHED_BATCH keeps the
// threads' fair share of the CPU and their nice value but lets none of them
// preempt on wakeup (sched(7)).
package cpusched

import "errors"

// Policy is a thread scheduling policy the relay can take.
type Policy string

// The policies of the process.cpu_scheduling setting.
const (
	// Batch is SCHED_BATCH (Linux).
	Batch Policy = "batch"
	// Inherited leaves the policy the process was started with (the
	// operating system's default, or what chrt or a service manager set).
	Inherited Policy = "inherited"
)

// ErrUnsupported is returned by Apply where the policy does not exist.
var ErrUnsupported = errors.New("this operating system has no SCHED_BATCH")

// Apply puts every thread of the process that runs under the default
// policy under p, keeping its nice value, and returns how many threads it
// looked at. Threads the Go runtime starts later are created by one of
// these and inherit the policy. Inherited sets nothing.
func Apply(p Policy) (int, error) {
	if p == Inherited {
		return 0, nil
	}
	return applyBatch()
}
