// Package sns is the outboxrelay sink that publishes every relayed
// message to an Amazon SNS topic with PublishBatch (Publish with a batch
// size of 1), built on aws-sdk-go-v2.
//
// A message is one SNS message: the envelope as its body and the relay's
// headers as String message attributes, as the sqs sink carries them
// (package awssink: at most 10 attributes, the rest packed as JSON in
// outboxrelay_headers, never dropped). On a FIFO topic (.fifo)
// MessageGroupId is the aggregate_id and MessageDeduplicationId the
// message_id. A standard topic promises no order to its subscribers.
//
// Batches hold one message of each of distinct aggregates; a failed entry
// SNS blames on the sender, or a Publish refused for its parameters, is a
// relay.Permanent error with SNS's code and message; other failures are
// retryable, and the relay sends only those messages again, so
// per-aggregate order survives partial failures.
//
// Tests run against goaws (package goawstest), which has Publish, topics
// and raw-delivery subscriptions to its queues, not PublishBatch or FIFO
// topics; PublishBatch's per-entry outcomes are tested against an in-test
// handler of SNS's query protocol.
package sns
