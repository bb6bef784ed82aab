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

// TestLagReported: while the handler holds every entry, the lag the Runner
// reports is the whole backlog (read and pending, or not yet read); once
// the entries are processed and acknowledged, it is 0.
func TestLagReported(t *testing.T) {
	ctx := context.Background()
	opt, err := goredis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Redis: %v", err)
		}
		t.Skipf("Redis not reachable (CI=true makes this a failure): %v", err)
	}
	stream := fmt.Sprintf("inboxtest:lag:%d:%d", os.Getpid(), time.Now().UnixNano())
	if err := rdb.XGroupCreateMkStream(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
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
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	l.WaitTotal(t, int64(len(l.Msgs)), 30*time.Second)
	l.Release()
	l.WaitTotal(t, 0, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
