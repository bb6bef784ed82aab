// Package pubsub is the outboxrelay sink that publishes every relayed
// message to a Google Cloud Pub/Sub topic, built on
// cloud.google.com/go/pubsub/v2.
//
// A [Sink] publishes one Pub/Sub message per relay message:
//
//   - topic: rendered from [Config.Topic] ({aggregate_type}, {event_type},
//     {table}), a topic id of [Config.Project];
//   - data: the envelope as the relay built it, unchanged;
//   - ordering key: the aggregate_id, with message ordering enabled, so
//     that a subscription with ordering enabled delivers an aggregate's
//     messages in order;
//   - attributes: the relay's headers as every sink carries them
//     (message_id, event_type, aggregate_id, aggregate_type, traceparent,
//     content-type, ce- attributes in cloudevents-binary format, the row's
//     headers).
//
// Outcomes: a message is delivered once Pub/Sub has answered its publish
// with a message id. A message Pub/Sub can never accept (an attribute or an
// ordering key that is not valid UTF-8 or too long, an attribute name
// starting with goog, a message over 10 MB, a rendered topic id that is not
// one) is a relay.Permanent error naming the reason, which the relay
// dead-letters; an InvalidArgument answer is permanent too. Everything else
// (unavailable, deadline exceeded, a missing topic, a refused permission)
// is retryable.
//
// Per-aggregate order: Pub/Sub's publisher pauses an ordering key after a
// failed publish and fails the messages of that key queued behind it, so
// none overtakes it. The sink resumes the key when the next message of the
// aggregate is published, which with the relay's gate (one unacknowledged
// message per aggregate) is the failed message's own retry.
//
// The emulator, or pstest in tests, is reached through
// PUBSUB_EMULATOR_HOST, which the client library reads.
package pubsub
