// Package nats is the outboxrelay sink for NATS JetStream, built on nats.go
// and its jetstream package.
//
// A [Sink] publishes every relayed message as one JetStream message:
//
//   - subject: rendered from [Config.Subject] (default
//     "outbox.{aggregate_type}.{event_type}"), each substituted value
//     percent-encoded so that it stays one subject token (see [Config.Subject]);
//   - data: the envelope bytes, unchanged;
//   - headers: the row's headers, then Nats-Msg-Id = message_id,
//     Nats-Expected-Stream = [Config.Stream], message_id, event_type,
//     aggregate_id, aggregate_type, traceparent (when non-empty) and
//     content-type: application/json, which win over row headers of the
//     same name. Row headers named Nats-* are refused (they steer the
//     server: rollups, expectations, TTLs).
//
// Publishing is asynchronous (PublishMsgAsync) and a message is reported
// through its done callback once the stream has stored it (its PubAck), or
// with a relay.Permanent error when the server will never store it: a
// subject that is not valid, a message over the server's max_payload or the
// stream's max_msg_size, a header name NATS cannot carry, or a subject that
// no stream or another stream than [Config.Stream] captures (every JetStream
// 4xx answer; see permanent).
//
// Everything else (a lost connection, an ack timeout, no responders while a
// stream leader is elected, 5xx answers) is retried by the sink itself, with
// backoff, in publish order: the message and every later one whose outcome
// is open are published again, with the same Nats-Msg-Id, before any new
// message. nats.go reconnects on its own; while it does, Publish blocks and
// Ready reports false. The stream's duplicate window (2 minutes by default)
// makes these republications, and those of the relay after a crash, land
// once: JetStream drops a message whose Nats-Msg-Id it stored within the
// window and acknowledges it as a duplicate.
//
// Order: messages reach the stream in the order of the Publish calls,
// across reconnects. Only a message the server refuses for a moment on a
// live connection (no responders, a 5xx answer, an ack timeout) while it
// accepts later ones can land after them.
//
// Tests run against a real nats-server with JetStream on 127.0.0.1:4222.
package nats
