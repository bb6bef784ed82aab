// Package rabbitmq is the RabbitMQ sink of outboxrelay. It publishes every
// relay.Message to one exchange with amqp091-go, with publisher confirms
// and the mandatory flag on, and implements relay.Sink and relay.Runner.
//
// # Guarantees
//
// A message is reported delivered (done(m, nil)) only after the broker
// acked that very publish on the channel it was published on and did not
// return it. In particular:
//
//   - Unroutable (basic.return, which RabbitMQ sends before the confirmation
//     of the same publish): reported as a relay.Permanent error wrapping
//     ErrUnroutable, never as success. Every publish carries the header
//     x-outboxrelay-publish-tag, the delivery tag of that publish on its
//     channel, and a return is matched by it: message ids may repeat among
//     the messages in flight and are never used to match. Consumers may
//     ignore the header; its value changes when a message is republished.
//   - Nacked (basic.nack, an internal broker error or a queue in
//     reject-publish overflow): reported as a retryable error wrapping
//     ErrNacked; the relay retries it. The sink does not republish it by
//     itself, because messages after it may already be confirmed and a
//     silent republish would hide the reordering from the relay. The
//     outcome of each publish is taken from its own deferred confirmation
//     (amqp091 PublishWithDeferredConfirm), not from the ack flag that
//     NotifyPublish delivers: amqp091 v1.16.0 passes a multiple ack on as
//     an ack for every tag it covers, also one nacked out of order before.
//   - Connection or channel lost: every message published on the dead
//     channel and not yet acked is republished by the sink on the next
//     channel, in the original publish order and before any new message, so
//     the relay only sees the outcome on the new channel. Messages the
//     broker had received but not yet acked are therefore duplicated
//     (at-least-once; consumers dedupe on message_id).
//   - Messages that can never be published as they are (empty routing key
//     or one over 255 bytes, message_id or event_type over 255 bytes, a
//     header name over 255 bytes, headers larger than the negotiated frame
//     size, a body over Config.MaxMessageBytes) fail with a relay.Permanent
//     error before anything is sent: sent, they would make the client or the
//     broker tear down the connection and every retry would do it again.
//
// # Routing keys
//
// The routing key is rendered from Config.RoutingKey. Substituted values are
// escaped so that each stays one topic word: '.', '*', '#' and '%' become
// %2E, %2A, %23 and %25. Bind queues with the escaped form, for example
// "order.order%2Ecreated" or "order.*".
//
// # Connection lifecycle
//
// New only checks the configuration. Connect makes one connection attempt
// so that a broker unreachable at start can be reported as a clear error;
// Run takes that connection over (or dials itself), redials with
// exponential backoff and jitter whenever the connection or channel drops,
// and returns nil once its context is done. Publish blocks while there is
// no usable channel (disconnected, or the broker sent connection.blocked)
// and while Config.MaxInFlight messages await confirmation; it honours its
// context throughout. Close ends Run and reports every message still
// awaiting confirmation as failed with a retryable error wrapping ErrClosed.
//
// # Concurrency
//
// All methods are safe for concurrent use. The relay calls Publish from one
// goroutine; done callbacks run on the goroutine of Run (confirmations) or
// of Publish (errors found before publishing) and may run concurrently with
// Publish. A done callback must not block and must not call Publish.
//
// Passwords in the URL never appear in logs or errors: they are shown as
// amqp://user:xxxxx@host.
package rabbitmq
