package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// TestLagReported: while the handler holds every entry, the lag the Runner
// reports is the whole backlog (read and pending, or not yet read); once
// the entries are processed and acknowledged, it is 0.
func TestLagReported(t *testing.T) {
	ctx := context.Background()
	rdb, stream := newGroup(ctx, t, "inboxtest:lag")
	defer rdb.Close()
	defer rdb.Del(ctx, stream)
	l := consumertest.NewLag(t, 40)
	for _, m := range l.Msgs {
		if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: relayFields(m)}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(l.In, l.Handler, Config{URL: redisURL(), Stream: stream, Group: "billing", Consumer: "lag", MaxInFlight: 16,
		Block: 100 * time.Millisecond, LagInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l.Check(t, int64(len(l.Msgs)), r.Run)
}
