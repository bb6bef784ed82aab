package sinks

import "errors"

// ErrClosed matches, with errors.Is, what the NATS, Redis and RabbitMQ sinks
// report for a message whose outcome was still open when the sink closed.
// It is retryable: the relay publishes such a message again after a
// restart. The Kafka sink reports franz-go's kgo.ErrClientClosed instead,
// as the client fails its in-flight records itself.
var ErrClosed = errors.New("sink closed before the broker confirmed the message")

// Closed returns a sink's own closed error: it reads msg, which names the
// broker and what it had not confirmed, and matches ErrClosed. A sink
// declares it once, as its exported ErrClosed.
func Closed(msg string) error { return &closedError{msg} }

type closedError struct{ msg string }

func (e *closedError) Error() string        { return e.msg }
func (e *closedError) Is(target error) bool { return target == ErrClosed }
