// Package redis is the outboxrelay sink for Redis Streams, built on
// go-redis v9.
//
// A [Sink] appends every relayed message to a stream with XADD (entry id
// "*", MAXLEN ~ [Config.MaxLen] when set):
//
//   - key: rendered from [Config.Stream] (default "outbox:{aggregate_type}");
//   - fields, in this order: message_id, event_type, aggregate_id,
//     aggregate_type, traceparent, tracestate (when set), content-type, the
//     CloudEvents attributes with the prefix ce_ in cloudevents-binary
//     format, headers (the row's headers as a JSON object, only when the row
//     has any) and envelope (the body, unchanged).
//
// Publish only queues the message; [Sink.Run] drains the queue in batches of
// up to [Config.BatchSize] and sends each batch as one MULTI/EXEC pipeline,
// one round trip for many messages. A batch is all or nothing on the server
// (an aborted transaction appends nothing), and batches go one at a time, in
// Publish order, so entries of one stream are in Publish order. A batch that
// fails as a whole (connection lost, timeout, OOM, READONLY replica, LOADING,
// NOPERM) is sent again, with backoff, before any later message, and Ready
// reports false until it goes through. A message is reported through its
// done callback once EXEC has returned its entry id, or with a
// relay.Permanent error when Redis refused that command alone (WRONGTYPE:
// the key holds something other than a stream).
//
// The reply to EXEC comes once the entries are in the server's memory,
// before an fsync (unless appendfsync is always) and before any replica
// has them. With [Config.WaitReplicas] the sink sends WAIT on the same
// connection after EXEC and reports the batch's messages with
// [ErrTooFewReplicas] (retryable) when fewer replicas acknowledged it in
// [Config.WaitTimeout]; the relay sends them again.
//
// Delivery is at-least-once: when a connection drops after EXEC was sent
// but before its reply arrived, the batch is sent again and may then be in
// the stream twice. Consumers dedupe on message_id. go-redis's own retries
// are off so that the sink is the one place that retries.
//
// Redis Cluster and Sentinel are not supported: [Config.URL] names one
// server (redis://, rediss:// or unix://).
//
// Tests run against a real Redis on 127.0.0.1:6379.
package redis
