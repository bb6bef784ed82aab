package kafka

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/outboxrelay/relay"
)

// permanentErrs are the produce errors that retrying the same record to the
// same topic cannot fix. They reach the promise only after franz-go has done
// its own retrying (unknown topics, for example, are retried across several
// metadata refreshes first).
//
// The rule is: a failure specific to this record or its destination is
// permanent; a failure of the whole connection or cluster (authentication,
// cluster authorization, unsupported versions, timeouts, a closed client) is
// retryable, so that a misconfigured or unavailable cluster stalls the relay,
// with /readyz failing, instead of dead-lettering every message.
//
// UNKNOWN_TOPIC_OR_PARTITION is not here: brokers answer it for a while
// whenever a partition's leadership is in flux (a rolling restart, a
// reassignment, a topic just created), and franz-go gives up after only
// kgo.UnknownTopicRetries attempts; dead-lettering then would drop messages
// that would have been taken a second later, out of their aggregate's order.
// The relay retries it with its own backoff, without limit, so a topic that
// really is missing (auto-creation off) stalls its aggregates, logged with
// every attempt, until it is created. A topic name that can never exist is
// caught before producing (checkTopic) or answered INVALID_TOPIC_EXCEPTION.
//
// UNKNOWN_TOPIC_ID is not here either, although franz-go never retries it: it
// means the topic was deleted and recreated, and the sink purges the old
// instance so that the relay's retry reaches the new one (see
// Sink.topicRecreated).
var permanentErrs = []error{
	kerr.MessageTooLarge,          // the record, or its batch, is over the broker's or topic's message size
	kerr.RecordListTooLarge,       // the batch is larger than the topic's segment size
	kerr.InvalidTopicException,    // the topic name is illegal or internal
	kerr.TopicAuthorizationFailed, // no ACL lets us write this topic
	kerr.InvalidRecord,            // the broker's validation rejected the record (e.g. compacted topic rules)
	kerr.InvalidTimestamp,         // the record timestamp is outside the topic's allowed range
	kerr.PolicyViolation,          // a broker policy refuses the record or the topic
}

// produceError is the error reported through done for a record that failed
// to be produced to topic: err wrapped with the topic, and marked with
// relay.Permanent when the broker will never accept the record as it is.
// It returns nil for a nil err. This is the one place that decides.
func produceError(topic string, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("produce to kafka topic %q: %w", topic, err)
	for _, p := range permanentErrs {
		if errors.Is(err, p) {
			return relay.Permanent(err)
		}
	}
	return err
}
