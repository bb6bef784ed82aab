package redis

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// newGroup connects to the tests' Redis and creates a stream of a name of
// its own (prefix, the pid, the time) with the group billing; the caller
// deletes the stream and closes rdb.
func newGroup(ctx context.Context, t *testing.T, prefix string) (*goredis.Client, string) {
	t.Helper()
	opt, err := goredis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		consumertest.Unreachable(t, "Redis", err)
	}
	stream := fmt.Sprintf("%s:%d:%d", prefix, os.Getpid(), time.Now().UnixNano())
	if err := rdb.XGroupCreateMkStream(ctx, stream, "billing", "0").Err(); err != nil {
		rdb.Close()
		t.Fatal(err)
	}
	return rdb, stream
}
