// Package kafka is the outboxrelay sink for Apache Kafka, built on franz-go.
//
// A [Sink] produces every relayed message as one record:
//
//   - topic: rendered from [Config.Topic] (default "outbox.{aggregate_type}");
//   - key: the aggregate_id, so the default (murmur2, Kafka-compatible) key
//     partitioner keeps every aggregate on one partition;
//   - value: the envelope bytes, unchanged;
//   - headers: message_id, event_type, traceparent (when non-empty),
//     content-type: application/json, then the row's headers in row order.
//
// With a Confluent [Config.ValueFormat] the value is instead the payload in
// the Confluent Schema Registry wire format (JSON or Avro binary after a zero
// byte and the schema's registry id), the message being built in CloudEvents
// binary mode so that its attributes are ce_ headers. Each schema of
// [Config.SchemasDir] is registered on first use, through franz-go's pkg/sr,
// and its id cached; a payload its schema cannot hold is reported as
// relay.Permanent.
//
// The producer is idempotent with acks=all and unbounded internal retries, so
// records of one aggregate reach the broker exactly in Publish order and a
// retry never duplicates or reorders them. A message is reported through its
// done callback only once the broker has acknowledged it, or with the error
// that stopped it: errors the broker will never accept (see [Config.Topic] and
// the package's classification of broker errors) are wrapped with
// relay.Permanent, everything else is retryable.
//
// A [TxnSink] (Config.ExactlyOnce) is the transactional form: it commits
// whole source transactions per Kafka transaction together with the relay's
// position in [DefaultPositionsTopic], so that a read_committed consumer sees
// each message once across crashes, restarts and takeovers.
//
// Tests run against kfake, franz-go's in-process Kafka, over TCP.
package kafka
