package relay

import (
	"cmp"
	"slices"
)

// pipe is the state of one aggregate published through a Pipeliner sink
// (publisher.pipe): present while any of its messages is out (at the sink,
// or at the parking store) or waiting. In the steady state an aggregate's
// messages go out as the stream submits them, any number at once. When one
// fails, the sink fails the aggregate's later ones too (Pipeliner); the
// relay holds the aggregate's new messages back, waits for every message
// out to be reported, and then treats the oldest failed one as the gate
// does a failure: it is retried or dead-lettered alone, its aggregate
// gated behind it. Once it is settled, the failed ones behind it and the
// held ones go out again together, in commit order.
type pipe struct {
	out     int        // handed over, outcome neither settled nor reported failed
	failed  []*Message // reported failed while others were out, by publish order
	waiting []*Message // held back, in commit order; all newer than those out
	// gated: one message at a time, the failed head being retried or
	// dead-lettered, or the messages of a parked aggregate.
	gated bool
	// draining: the publish loop is handing waiting messages over; new
	// ones wait until it is done, so that none overtakes them.
	draining bool
}

// admitPiped reports whether m may be published now; if not, m waits and
// is returned later by settledPiped or drained.
func (a *aggregates) admitPiped(m *Message) bool {
	k := keyOf(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.pipes[k]
	if st == nil {
		st = a.newPipe()
		st.out = 1
		_, st.gated = a.heads[k] // a parked aggregate's messages go to the store one at a time
		a.pipes[k] = st
		return true
	}
	if st.gated || st.draining || len(st.failed) > 0 || len(st.waiting) > 0 {
		st.waiting = append(st.waiting, m)
		a.held++
		return false
	}
	st.out++
	return true
}

// failedPiped records that m, out, was reported failed. Once none of its
// aggregate's messages is out any more, it returns the oldest failed one,
// which the caller must retry or dead-letter; the others wait behind it.
func (a *aggregates) failedPiped(m *Message) (head *Message) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.pipes[keyOf(m)]
	st.out--
	i, _ := slices.BinarySearchFunc(st.failed, m.seq, func(x *Message, seq uint64) int { return cmp.Compare(x.seq, seq) })
	st.failed = slices.Insert(st.failed, i, m)
	if st.out > 0 {
		return nil
	}
	return a.recoverLocked(st)
}

// recoverLocked gates st behind its oldest failed message and returns it.
func (a *aggregates) recoverLocked(st *pipe) *Message {
	head := st.failed[0]
	behind := len(st.failed) - 1
	st.waiting = append(st.failed[1:len(st.failed):len(st.failed)], st.waiting...)
	a.held += behind
	st.failed = nil
	st.gated = true
	st.out = 1
	return head
}

// settledPiped records that m, out, was settled (acknowledged,
// dead-lettered or parked). It returns the messages to hand over now:
// one (next) while the aggregate stays gated, or all that wait (drain),
// which the publish loop hands over before calling drained. head is
// non-nil when a failure was waiting for m's outcome: the caller retries
// or dead-letters it.
func (a *aggregates) settledPiped(m *Message) (next *Message, drain []*Message, head *Message) {
	k := keyOf(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.pipes[k]
	st.out--
	if st.out > 0 {
		return nil, nil, nil
	}
	if len(st.failed) > 0 {
		return nil, nil, a.recoverLocked(st)
	}
	if len(st.waiting) == 0 {
		if !st.draining {
			a.dropPipe(k, st)
		}
		return nil, nil, nil
	}
	if _, parked := a.heads[k]; parked {
		st.gated = true
		next = st.waiting[0]
		st.waiting[0] = nil
		st.waiting = st.waiting[1:]
		a.held--
		st.out = 1
		return next, nil, nil
	}
	return nil, a.drainLocked(st), nil
}

// drainLocked hands every waiting message of st over at once.
func (a *aggregates) drainLocked(st *pipe) []*Message {
	drain := st.waiting
	st.waiting = nil
	a.held -= len(drain)
	st.out += len(drain)
	st.gated = false
	st.draining = true
	return drain
}

// drained is called by the publish loop once it has handed over the
// messages settledPiped or drained returned for aggregate k. It returns
// the ones that came to wait meanwhile, to hand over in turn.
func (a *aggregates) drained(k aggregateKey) []*Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.pipes[k]
	if st == nil {
		return nil
	}
	st.draining = false
	if st.gated || len(st.failed) > 0 {
		return nil
	}
	if len(st.waiting) > 0 {
		return a.drainLocked(st)
	}
	if st.out == 0 {
		a.dropPipe(k, st)
	}
	return nil
}

func (a *aggregates) newPipe() *pipe {
	if n := len(a.freePipes); n > 0 {
		st := a.freePipes[n-1]
		a.freePipes = a.freePipes[:n-1]
		return st
	}
	return new(pipe)
}

// dropPipe forgets an aggregate with nothing out or waiting, keeping its
// state for reuse: a busy relay would allocate one per message otherwise.
func (a *aggregates) dropPipe(k aggregateKey, st *pipe) {
	delete(a.pipes, k)
	if len(a.freePipes) < 1024 {
		*st = pipe{}
		a.freePipes = append(a.freePipes, st)
	}
}
