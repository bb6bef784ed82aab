package kafka

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outboxrelay/relay"
)

// TestUnknownTopicOrPartitionIsRetryable: while a partition's leadership
// moves, the broker answers UNKNOWN_TOPIC_OR_PARTITION for longer than
// franz-go's unknown-topic retries last. The record must come back
// retryable, so that the relay publishes it again instead of dead-lettering
// it, and the retry must land once the partition is back.
func TestUnknownTopicOrPartitionIsRetryable(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "outbox.order"))
	// Quick metadata refreshes only shorten franz-go's retries (15 s by default).
	s := newSink(t, c, Config{Opts: []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond)}})
	cons := newConsumer(t, c, "outbox.order")

	moving := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.UnknownTopicOrPartition, Count: -1})
	m := &relay.Message{ID: "during-move", AggregateType: "order", AggregateID: "1", Envelope: []byte("{}")}
	start := time.Now()
	err := publishOne(t, s, m)
	t.Logf("franz-go gave up after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil || !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("err %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
	if !relay.Retryable(err) {
		t.Fatalf("err %v is permanent: the relay would dead-letter a message that is taken once the partition is back", err)
	}
	moving.Remove()

	if err := publishOne(t, s, m); err != nil {
		t.Fatalf("retry after the move: %v", err)
	}
	if id := header(cons.records(t, 1)[0], HeaderMessageID); id != m.ID {
		t.Errorf("stored %q, want %q", id, m.ID)
	}
}
