package relay

import "context"

// Sink is the broker side of the relay. The relay hands it messages in
// commit order and learns of each outcome through done. It hands over a
// message only once the previous message of the same aggregate has been
// acknowledged (or dead-lettered), so a sink's failures, whatever they do to
// the messages behind the failed one, never reorder an aggregate.
//
// Implementations: sinks/kafka, sinks/rabbitmq.
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
