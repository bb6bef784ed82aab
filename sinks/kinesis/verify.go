package kinesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

// VerifyReader reads the streams the rows map to, every shard, with
// GetShardIterator and GetRecords: reading a Kinesis stream consumes
// nothing, so the consumers are not disturbed.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	cfg := c.withDefaults()
	dest, err := sinks.Destinations(cfg.Stream)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.kinesis.stream: %w", err)
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	return &verifyReader{client: client, timeout: cfg.Timeout, pause: 200 * time.Millisecond}, dest, nil
}

// verifyReader reads the message ids of the records of streams, shard by
// shard, from since up to what each shard held when Read started.
type verifyReader struct {
	client  *kinesis.Client
	timeout time.Duration // bound of one call
	pause   time.Duration // between calls that read nothing while behind, and after a throttled one
}

var _ verify.Reader = (*verifyReader)(nil)

// Read implements verify.Reader. A stream that does not exist holds
// nothing and is skipped. Every call is bounded by the sink's timeout and
// every loop by ctx.
func (r *verifyReader) Read(ctx context.Context, since time.Time, streams []string, fn func(id string) error) error {
	start := time.Now().Add(time.Minute)
	for _, stream := range streams {
		shards, err := r.shards(ctx, stream)
		var nf *types.ResourceNotFoundException
		if errors.As(err, &nf) {
			continue
		}
		if err != nil {
			return fmt.Errorf("list the shards of kinesis stream %s: %w", stream, err)
		}
		for _, shard := range shards {
			if err := r.readShard(ctx, stream, shard, since, start, fn); err != nil {
				return fmt.Errorf("read shard %s of kinesis stream %s: %w", shard, stream, err)
			}
		}
	}
	return nil
}

// shards lists every shard of stream, the closed ones (parents of a
// resharding, still within the retention) too.
func (r *verifyReader) shards(ctx context.Context, stream string) ([]string, error) {
	var ids []string
	in := &kinesis.ListShardsInput{StreamName: aws.String(stream)}
	for {
		cctx, cancel := context.WithTimeout(ctx, r.timeout)
		out, err := r.client.ListShards(cctx, in)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, sh := range out.Shards {
			ids = append(ids, aws.ToString(sh.ShardId))
		}
		if out.NextToken == nil {
			return ids, nil
		}
		in = &kinesis.ListShardsInput{NextToken: out.NextToken} // a page token goes without the stream name
	}
}

// readShard passes the ids of the records of one shard that arrived at or
// after since. It stops at the first of: a record that arrived a minute
// (for clock skew) after start (the shard as it was when Read started is
// read, however fast rows go on arriving), a closed
// shard's end (no next iterator), or an empty answer at the tip
// (MillisBehindLatest 0). An empty answer behind the tip is normal on a
// sparse shard, and reading goes on after a pause, as it does after a
// throttled call.
func (r *verifyReader) readShard(ctx context.Context, stream, shard string, since, start time.Time, fn func(id string) error) error {
	it, err := r.iterator(ctx, stream, shard, since)
	if err != nil {
		return err
	}
	for it != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, r.timeout)
		out, err := r.client.GetRecords(cctx, &kinesis.GetRecordsInput{ShardIterator: it, Limit: aws.Int32(10_000)})
		cancel()
		var throttled *types.ProvisionedThroughputExceededException
		if errors.As(err, &throttled) {
			if err := sleep(ctx, r.pause); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		for _, rec := range out.Records {
			at := aws.ToTime(rec.ApproximateArrivalTimestamp)
			if at.After(start) {
				return nil
			}
			if at.Before(since) {
				continue // read from the oldest record: see iterator
			}
			if id := recordID(rec.Data); id != "" {
				if err := fn(id); err != nil {
					return err
				}
			}
		}
		it = out.NextShardIterator
		if len(out.Records) == 0 {
			if aws.ToInt64(out.MillisBehindLatest) == 0 {
				return nil
			}
			if err := sleep(ctx, r.pause); err != nil {
				return err
			}
		}
	}
	return nil
}

// iterator returns an AT_TIMESTAMP iterator at since. A server that does
// not answer that within the timeout gets a TRIM_HORIZON one instead,
// whose older records readShard skips: kinesalite never answers
// AT_TIMESTAMP for a shard without a record since then.
func (r *verifyReader) iterator(ctx context.Context, stream, shard string, since time.Time) (*string, error) {
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	out, err := r.client.GetShardIterator(cctx, &kinesis.GetShardIteratorInput{
		StreamName: aws.String(stream), ShardId: aws.String(shard),
		ShardIteratorType: types.ShardIteratorTypeAtTimestamp, Timestamp: aws.Time(since),
	})
	cancel()
	if err == nil {
		return out.ShardIterator, nil
	}
	if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("shard iterator at %s: %w", since.Format(time.RFC3339), err)
	}
	cctx, cancel = context.WithTimeout(ctx, r.timeout)
	defer cancel()
	out, err = r.client.GetShardIterator(cctx, &kinesis.GetShardIteratorInput{
		StreamName: aws.String(stream), ShardId: aws.String(shard), ShardIteratorType: types.ShardIteratorTypeTrimHorizon,
	})
	if err != nil {
		return nil, fmt.Errorf("shard iterator at the oldest record: %w", err)
	}
	return out.ShardIterator, nil
}

// recordID is the message id a record's data holds: message_id of the
// envelope, id of a structured CloudEvent (the formats a Kinesis sink
// takes), or "" for data that is neither.
func recordID(data []byte) string {
	var body struct {
		MessageID   string `json:"message_id"`
		ID          string `json:"id"`
		SpecVersion string `json:"specversion"`
	}
	if json.Unmarshal(data, &body) != nil {
		return ""
	}
	if body.SpecVersion != "" {
		return body.ID
	}
	return body.MessageID
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close implements verify.Reader; the client holds no connection of its
// own to release.
func (r *verifyReader) Close() error { return nil }
