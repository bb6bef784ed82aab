package relay

import (
	"context"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// Sink is the broker side of the relay. The relay hands it messages in
// commit order and learns of each outcome through done. It hands over a
// message only once the previous message of the same aggregate has been
// acknowledged (or dead-lettered), so a sink's failures, whatever they do to
// the messages behind the failed one, never reorder an aggregate.
//
// Implementations: the packages under sinks/ (kafka, nats, rabbitmq,
// redis, webhook); each registers itself with package sinks.
type Sink interface {
	// Publish starts publishing m and returns without waiting for the
	// broker. It must call done exactly once for m, with nil once the broker
	// has durably accepted it or with the error that stopped it; done may be
	// called from any goroutine, and before Publish returns. Messages
	// published with the same AggregateID must reach the broker in the order
	// of the Publish calls. Publish may block for broker flow control; it
	// returns early, reporting ctx.Err() through done, when ctx is cancelled.
	Publish(ctx context.Context, m *Message, done func(*Message, error))

	// Ready reports whether the sink is connected to its broker.
	Ready() bool

	// Close releases the sink's connections. Messages whose outcome has not
	// been reported yet are reported as failed. Close is safe to call once
	// publishing has stopped.
	Close() error
}

// Runner is implemented by sinks that own long-lived goroutines (for example
// a redial loop). The relay runs it for as long as it relays.
type Runner interface {
	Run(ctx context.Context) error
}

// Transactional is implemented by sinks that write whole source
// transactions to the broker atomically, together with the position they
// reach (sinks/kafka with exactly_once). With such a sink the relay
//   - asks for Position when a session starts, once every message handed
//     over before has been settled, and skips every source transaction that
//     committed at or below it, whatever the slot says;
//   - hands a transaction's messages over only once it has been received in
//     full, and then calls EndTxn;
//   - publishes without the per-aggregate gate: nothing is retried message
//     by message, so the order of Publish calls (commit order) is the order
//     in the broker. A retryable failure reported through done stops the
//     relay; a permanent one dead-letters the message without parking its
//     aggregate.
type Transactional interface {
	Sink
	// Position returns the commit LSN of the newest source transaction the
	// broker holds committed, 0 when it holds none. It first fences off
	// any earlier writer with the same identity, so that nothing that
	// writer still had in flight can commit afterwards.
	Position(ctx context.Context) (cdc.LSN, error)
	// EndTxn says that every message of the source transaction that
	// committed at commitLSN has been passed to Publish. The sink reports
	// their outcomes only once they are committed in the broker together
	// with a position of at least commitLSN. Called from the stream
	// goroutine; it must not block.
	EndTxn(commitLSN cdc.LSN)
}

// Pipeliner is implemented by sinks that keep an aggregate's first
// deliveries in commit order with several of its messages at the sink at
// once (sinks/kafka). With such a sink and the default order, the relay
// hands an aggregate's messages over without waiting for the previous
// one's acknowledgement, and falls back to one at a time only while a
// failure of the aggregate is handled (see pipeline.go).
type Pipeliner interface {
	Sink
	// Pipeline switches the sink to pipelined publishing and reports
	// whether it did; the relay calls it once, before the first Publish.
	// From then on the sink must keep two promises for each aggregate
	// (same AggregateType and AggregateID): once it has reported a
	// failure for one of its messages, it reports every message of the
	// aggregate handed to it later as failed, without sending it, until
	// Resume; and it never reports a message as acknowledged when an
	// earlier one of its aggregate, handed over before it, was reported
	// failed. Together they mean that no later message can reach the
	// broker ahead of a failed one's retry.
	Pipeline() bool
	// Resume lifts the hold on the aggregate. The relay calls it once every
	// message of the aggregate it handed over has been reported, before it
	// hands over the failed one again (or dead-letters it).
	Resume(aggregateType, aggregateID string)
}
