package redis

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestSlowHandlerKeepsItsEntry: while a handler runs for longer than
// MinIdle, the Runner keeps its entry's idle time low, so another
// consumer's XAUTOCLAIM with the same MinIdle does not take it (and run it a
// second time, out of order).
func TestSlowHandlerKeepsItsEntry(t *testing.T) {
	ctx := context.Background()
	rdb, stream := newGroup(ctx, t, "inboxtest:idle")
	defer rdb.Close()
	defer func() { _ = rdb.Del(context.Background(), stream).Err() }()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msgs := ledger.Generate(1, 1)
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(pool, "billing", inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: relayFields(msgs[0])}).Err(); err != nil {
		t.Fatal(err)
	}
	const minIdle = 1500 * time.Millisecond
	started := make(chan struct{}, 1)
	r, err := New(in, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		started <- struct{}{}
		time.Sleep(3 * minIdle)
		return ledger.Apply(ctx, tx, m.ID, m.Payload, false)
	}, Config{URL: redisURL(), Stream: stream, Group: "billing", Consumer: "slow", MinIdle: minIdle, ClaimInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-started
	claims := 0
	for deadline := time.Now().Add(2 * minIdle); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ms, _, err := rdb.XAutoClaim(ctx, &goredis.XAutoClaimArgs{Stream: stream, Group: "billing", Consumer: "other",
			MinIdle: minIdle, Start: "0-0", Count: 10}).Result()
		if err != nil {
			t.Fatal(err)
		}
		claims++
		if len(ms) > 0 {
			t.Fatalf("another consumer claimed the running handler's entry %s after %d tries", ms[0].ID, claims)
		}
	}
	t.Logf("%d claims over %v found nothing to take", claims, 2*minIdle)
}
