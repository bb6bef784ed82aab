package redis

import (
	"context"
	"fmt"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
	goredis "github.com/redis/go-redis/v9"
	"strconv"
	"time"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the streams the rows map to.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	opt, err := goredis.ParseURL(c.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.redis.url: %w", err)
	}
	dest, err := sinks.Destinations(c.Stream)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.redis.stream: %w", err)
	}
	return verifyReader{Client: goredis.NewClient(opt)}, dest, nil
}

// verifyReader reads the message_id field of the entries of the destination
// streams whose ids (the time Redis stored them) are at or after since, up
// to each stream's last entry when Read started. XRANGE reads without
// consuming: groups and their pending entries are left as they were.
type verifyReader struct {
	Client *goredis.Client
}

var _ verify.Reader = verifyReader{}

// Read implements verify.Reader.
func (r verifyReader) Read(ctx context.Context, since time.Time, streams []string, fn func(id string) error) error {
	for _, key := range streams {
		tail, err := r.Client.XRevRangeN(ctx, key, "+", "-", 1).Result()
		if err != nil {
			return fmt.Errorf("read redis stream %q: %w", key, err)
		}
		if len(tail) == 0 {
			continue // no such stream, or empty
		}
		end := tail[0].ID
		start := strconv.FormatInt(since.UnixMilli(), 10) + "-0"
		for {
			entries, err := r.Client.XRangeN(ctx, key, start, end, 1000).Result()
			if err != nil {
				return fmt.Errorf("read redis stream %q: %w", key, err)
			}
			for _, e := range entries {
				if id, ok := e.Values["message_id"].(string); ok {
					if err := fn(id); err != nil {
						return err
					}
				}
			}
			if len(entries) < 1000 || entries[len(entries)-1].ID == end {
				break
			}
			start = "(" + entries[len(entries)-1].ID
		}
	}
	return nil
}

// Close implements verify.Reader.
func (r verifyReader) Close() error { return r.Client.Close() }
