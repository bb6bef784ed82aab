package redis

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestRunReturnsAndLeavesNoGoroutine: a Runner in this process consumes a
// backlog, is stopped by its context while entries still arrive, returns
// within its drain and read bounds with every entry it finished
// acknowledged, and leaves no goroutine behind (its workers, the idle-time
// refresher, go-redis's pool).
func TestRunReturnsAndLeavesNoGoroutine(t *testing.T) {
	ctx := context.Background()
	rdb, stream := newGroup(ctx, t, "inboxtest:leak")
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	msgs := ledger.Generate(400, 16)
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
	add := func(ms []ledger.Msg) error {
		for _, m := range ms {
			if err := rdb.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: relayFields(m)}).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := add(msgs[:300]); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	r, err := New(in, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return ledger.Apply(ctx, tx, m.ID, m.Payload, false)
	}, Config{URL: redisURL(), Stream: stream, Group: "billing", Consumer: "leak", MinIdle: 3 * time.Second,
		Block: 200 * time.Millisecond, DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	consumertest.WaitFor(t, "200 messages", 60*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) >= 200 })
	added := make(chan error, 1)
	go func() { added <- add(msgs[300:]) }() // still arriving when the stop comes
	stop()
	stopped := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end (drain 5s, read block 200ms)")
	}
	took := time.Since(stopped)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	done2 := consumertest.Runs(ctx, t, pool)
	// Every committed message is acknowledged: what is still pending for
	// this consumer was never processed.
	pend, err := rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: stream, Group: "billing", Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, p := range pend {
		var id string
		res, err := rdb.XRange(ctx, stream, p.ID, p.ID).Result()
		if err != nil || len(res) != 1 {
			t.Fatalf("pending entry %s: %v", p.ID, err)
		}
		id, _ = res[0].Values["message_id"].(string)
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE message_id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("entry %s (message %s) is committed but still pending after the stop", p.ID, id)
		}
	}
	t.Logf("stopped after %d of 400 messages in %v, %d entries left pending unprocessed", done2, took, len(pend))
	if err := rdb.Del(ctx, stream).Err(); err != nil {
		t.Error(err)
	}
	rdb.Close()
	pool.Close()
	goleak.VerifyNone(t, before)
}
