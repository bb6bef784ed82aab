package relay

import "sync"

// aggregates keeps each aggregate's first deliveries in commit order by
// handing the sink at most one unacknowledged message per aggregate: a
// message is published only once the message before it in the same aggregate
// has been acknowledged by the broker or stored as a dead letter. The ones
// behind it wait here, in commit order, and count against the in-flight
// window like published ones, so memory stays bounded by Config.MaxInFlight.
//
// Why not pipeline and rely on the sink's per-key order: that order holds
// only while nothing fails. A broker that nacks or returns one message,
// fails one record (too large, invalid), loses a partition's metadata or
// drops the connection has often already stored the messages pipelined
// behind it, and the retry then lands after them; franz-go, for example,
// fails every record buffered behind a batch that failed fatally, including
// batches it has written and the broker may have stored. Once a later message
// of the aggregate has been acknowledged, no retry can undo its arrival, so
// the only way to guarantee the order of first deliveries is to not have a
// later message in flight while an earlier one may still fail. The price is
// one broker round trip per message of a hot aggregate; many aggregates
// still pipeline (see BenchmarkAggregateOrder).
//
// Safe for concurrent use: dispatch admits from the stream goroutine,
// outcomes release from sink goroutines.
type aggregates struct {
	mu sync.Mutex
	// busy holds an entry for every aggregate with a message at the sink
	// (or waiting to be retried or dead-lettered); its value is the
	// aggregate's later messages, oldest first. A nil slice is an aggregate
	// with nothing waiting, so the common case allocates nothing.
	busy map[aggregateKey][]*Message
	held int // messages waiting, over all aggregates
	// heads holds the aggregates parked behind a dead letter
	// (DeadLetterPark): their messages still pass through busy one at a
	// time, but to the parking store instead of the sink.
	heads map[aggregateKey]struct{}
	// pipes replaces busy with a Pipeliner sink (pipeline.go).
	pipes     map[aggregateKey]*pipe
	freePipes []*pipe
}

// aggregateKey identifies an aggregate: its type and id, as in the outbox row.
type aggregateKey struct{ typ, id string }

func newAggregates() *aggregates {
	return &aggregates{busy: make(map[aggregateKey][]*Message), heads: make(map[aggregateKey]struct{}), pipes: make(map[aggregateKey]*pipe)}
}

func keyOf(m *Message) aggregateKey { return aggregateKey{m.AggregateType, m.AggregateID} }

// admit reports whether m may be published now. If not, m waits behind the
// aggregate's earlier messages and is returned by a later call of next.
func (a *aggregates) admit(m *Message) bool {
	k := keyOf(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	waiting, busy := a.busy[k]
	if !busy {
		a.busy[k] = nil
		return true
	}
	a.busy[k] = append(waiting, m)
	a.held++
	return false
}

// next is called once m, the aggregate's message at the sink, is settled
// (acknowledged or dead-lettered). It returns the aggregate's next message,
// which the caller must publish, or nil when none waits.
func (a *aggregates) next(m *Message) *Message {
	k := keyOf(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	waiting := a.busy[k]
	if len(waiting) == 0 {
		delete(a.busy, k)
		return nil
	}
	n := waiting[0]
	waiting[0] = nil
	if len(waiting) == 1 {
		waiting = nil // let a drained hot aggregate's array go
	} else {
		waiting = waiting[1:]
	}
	a.busy[k] = waiting
	a.held--
	return n
}

// park marks k parked behind a dead letter.
func (a *aggregates) park(k aggregateKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.heads[k] = struct{}{}
}

// unpark marks k released from its dead letter.
func (a *aggregates) unpark(k aggregateKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.heads, k)
}

// parked reports whether k is marked parked.
func (a *aggregates) parked(k aggregateKey) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.heads[k]
	return ok
}
