package kafka

import (
	"context"
	"errors"
	"fmt"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"time"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the topics the rows map to, with the sink's own
// client settings (TLS, SASL).
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	opts, err := c.ClientOpts()
	if err != nil {
		return nil, nil, err
	}
	dest, err := sinks.Destinations(c.Topic)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.kafka.topic: %w", err)
	}
	return verifyReader{Opts: opts}, dest, nil
}

// verifyReader reads the message_id header of the records in the destination
// topics, from the first offset whose timestamp is at or after since to the
// end offset when Read started. It is safe to run beside the relay and
// consumers: it commits no offsets and joins no group.
type verifyReader struct {
	// Opts connect the client (seed brokers, TLS, SASL).
	Opts []kgo.Opt
}

var _ verify.Reader = verifyReader{}

// Read implements verify.Reader.
func (k verifyReader) Read(ctx context.Context, since time.Time, topics []string, fn func(id string) error) error {
	if len(topics) == 0 {
		return nil
	}
	admin, err := kgo.NewClient(k.Opts...)
	if err != nil {
		return err
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	starts, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
	if err != nil {
		return fmt.Errorf("list offsets after %s: %w", since.Format(time.RFC3339), err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	from := map[string]map[int32]kgo.Offset{}
	left := map[string]map[int32]int64{} // the end offset still to reach
	var failed error
	starts.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			if !errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
				failed = errors.Join(failed, fmt.Errorf("topic %s partition %d: %w", o.Topic, o.Partition, o.Err))
			}
			return // a topic that does not exist holds nothing
		}
		end, ok := ends.Lookup(o.Topic, o.Partition)
		if !ok || end.Err != nil || o.Offset < 0 || o.Offset >= end.Offset {
			return
		}
		if from[o.Topic] == nil {
			from[o.Topic] = map[int32]kgo.Offset{}
			left[o.Topic] = map[int32]int64{}
		}
		from[o.Topic][o.Partition] = kgo.NewOffset().At(o.Offset)
		left[o.Topic][o.Partition] = end.Offset
	})
	if failed != nil {
		return failed
	}
	if len(from) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), k.Opts...), kgo.ConsumePartitions(from), kgo.FetchMaxWait(500*time.Millisecond))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	remaining := 0
	for _, ps := range left {
		remaining += len(ps)
	}
	for remaining > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(topic string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("fetch %s partition %d: %w", topic, p, err))
		})
		if ferr != nil {
			return ferr
		}
		var cbErr error
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := left[r.Topic][r.Partition]
			if !ok || r.Offset >= end || cbErr != nil {
				return
			}
			for _, h := range r.Headers {
				if h.Key == "message_id" {
					cbErr = fn(string(h.Value))
					break
				}
			}
			if r.Offset+1 >= end {
				delete(left[r.Topic], r.Partition)
				remaining--
			}
		})
		if cbErr != nil {
			return cbErr
		}
		// A partition whose tail was compacted or deleted never shows its
		// last offset: the high watermark says it is done.
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			end, ok := left[p.Topic][p.Partition]
			if ok && len(p.Records) == 0 && p.HighWatermark >= end && p.LogStartOffset >= end {
				delete(left[p.Topic], p.Partition)
				remaining--
			}
		})
	}
	return nil
}

// Close implements verify.Reader.
func (verifyReader) Close() error { return nil }
