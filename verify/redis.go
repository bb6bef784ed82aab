package verify

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Redis reads the message_id field of the entries of the destination
// streams whose ids (the time Redis stored them) are at or after since, up
// to each stream's last entry when Read started. XRANGE reads without
// consuming: groups and their pending entries are left as they were.
type Redis struct {
	Client *goredis.Client
}

var _ Reader = Redis{}

// Read implements Reader.
func (r Redis) Read(ctx context.Context, since time.Time, streams []string, fn func(id string) error) error {
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

// Close implements Reader.
func (r Redis) Close() error { return r.Client.Close() }
