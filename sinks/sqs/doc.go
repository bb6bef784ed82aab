// Package sqs is the outboxrelay sink that sends every relayed message to
// an Amazon SQS queue with SendMessageBatch, built on aws-sdk-go-v2.
//
// A message becomes one SQS message: the envelope as its body, unchanged
// (SQS takes text only: a body that is not UTF-8 XML characters is
// refused, so use the envelope or cloudevents format for binary payloads,
// which carry them as base64), and the relay's headers (message_id,
// event_type, aggregate_id, aggregate_type, traceparent, content-type,
// ce- attributes in cloudevents-binary format, the row's headers) as
// String message attributes named as the headers. SQS takes at most 10
// attributes and no empty value: when there are more, or one is empty, the
// first 9 non-empty headers stay attributes of their own and all the
// others travel as one JSON object in the attribute outboxrelay_headers.
// No header is ever dropped.
//
// On a FIFO queue (a name ending in .fifo) MessageGroupId is the
// aggregate_id (its SHA-256, as sha256:<hex>, when it is not 1 to 128
// printable ASCII characters) and MessageDeduplicationId the message_id,
// so SQS drops a resend within its five-minute deduplication interval and
// consumers get each aggregate's messages in order. A standard queue
// delivers at least once in no promised order: consumers that need
// per-aggregate order must use a FIFO queue.
//
// Batches: at most [Config.BatchSize] messages, one of each of distinct
// aggregates, and [Config.MaxMessageBytes] in all. Entries succeed or fail
// one by one: an entry SQS blames on the sender (SenderFault) is a
// relay.Permanent error with SQS's code and message, which the relay
// dead-letters; any other failed entry, and a request that fails as a
// whole, is retryable, and the relay sends only those messages again.
// Because a batch never holds two messages of an aggregate and the next
// one of an aggregate is sent only after the one before it succeeded,
// per-aggregate order survives any mix of partial failures. The SDK does
// not retry on its own.
//
// Tests run against package sqstest, an in-test server of the SQS JSON
// protocol with FIFO semantics.
package sqs
