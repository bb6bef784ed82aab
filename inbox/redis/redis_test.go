package redis

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// redisURL is the Redis the tests use (.ci/services starts it);
// OUTBOXRELAY_REDIS_URL overrides.
func redisURL() string {
	if u := os.Getenv("OUTBOXRELAY_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379"
}

// The end-to-end test's consumers are child processes (consumertest), so
// that they can be killed with SIGKILL.
func TestMain(m *testing.M) { os.Exit(consumertest.Main(m, runChild)) }

func runChild(ctx context.Context, in *inbox.Inbox, h inbox.Handler, stream, name string, batch int) error {
	r, err := New(in, h, Config{URL: redisURL(), Stream: stream, Group: consumertest.Name, Consumer: name,
		MaxInFlight: 32, Batch: batch, MinIdle: 2 * time.Second, DrainTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// TestConsumersKilledExactlyOnce: consumers of one group, one process at a
// time (Redis would spread an aggregate over two), each under a new
// consumer name, are killed with SIGKILL, two of them right after an inbox
// commit and before the XACK, one by the test at a random point, while the
// producer side appends duplicates (as a relay restarted with kill -9
// does). A dead consumer's pending entries are claimed by the next one
// (XAUTOCLAIM) before it reads new entries. Every effect must be applied
// exactly once, in per-account order; a consumer stopped with SIGTERM
// leaves nothing for the next one to redo.
func TestConsumersKilledExactlyOnce(t *testing.T) {
	t.Run("per message", func(t *testing.T) { testKilled(t, 0) })
	t.Run("batch", func(t *testing.T) { testKilled(t, 16) })
}

func testKilled(t *testing.T, batch int) {
	ctx := context.Background()
	rdb, stream := newGroup(ctx, t, "inboxtest")
	defer rdb.Close()
	defer func() { _ = rdb.Del(context.Background(), stream).Err() }()

	pg := pgtest.Database(t)
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msgs := ledger.Generate(1500, 30)
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	publish := func(ms []ledger.Msg) {
		p := rdb.Pipeline()
		for _, m := range ms {
			p.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: relayFields(m)})
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pendingZero := func() bool {
		p, err := rdb.XPending(ctx, stream, "billing").Result()
		if err != nil {
			t.Fatal(err)
		}
		g, err := rdb.XInfoGroups(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		return p.Count == 0 && len(g) == 1 && g[0].Lag == 0
	}
	h := &consumertest.Harness{T: t, Target: stream, PG: pg, Dir: t.TempDir(), Batch: batch}

	upstreamDups := 0
	publish(msgs[:600])
	publish(msgs[400:600])
	upstreamDups += 200
	a := h.Start("a", 100) // dies between its inbox commit and its ack
	if err := a.WaitExit(t, 60*time.Second); err == nil || a.Count("crash") != 1 {
		t.Fatalf("consumer a exited with %v, crash noted %d times; want one crash", err, a.Count("crash"))
	}
	kills := 1

	b := h.Start("b", 0)
	publish(msgs[600:1100])
	publish(msgs[900:1100])
	upstreamDups += 200
	consumertest.WaitFor(t, "700 messages", 90*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) >= 700 })
	if err := b.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.WaitExit(t, 10*time.Second)
	kills++

	c := h.Start("c", 150)
	publish(msgs[1100:])
	publish(msgs[1300:1400])
	upstreamDups += 100
	if err := c.WaitExit(t, 90*time.Second); err == nil || c.Count("crash") != 1 {
		t.Fatalf("consumer c exited with %v, crash noted %d times; want one crash", err, c.Count("crash"))
	}
	kills++

	e := h.Start("e", 0)
	consumertest.WaitFor(t, "every message", 120*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) == len(msgs) })
	consumertest.WaitFor(t, "every entry acknowledged", 60*time.Second, pendingZero)
	if err := e.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitExit(t, 20*time.Second); err != nil || e.Count("stopped") != 1 {
		t.Fatalf("consumer e on SIGTERM: %v, stopped %d; want a clean stop", err, e.Count("stopped"))
	}
	// What f would get is pending or unread in the group now, whether or
	// not f is consuming by the time it is stopped.
	if !pendingZero() {
		t.Error("after e's clean stop the group has entries pending or unread; want none (acknowledged work handed back)")
	}
	f := h.Start("f", 0)
	time.Sleep(3 * time.Second)
	if err := f.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitExit(t, 20*time.Second); err != nil {
		t.Fatalf("consumer f on SIGTERM: %v", err)
	}
	if n := f.Count("processed") + f.Count("duplicate"); n != 0 {
		t.Errorf("consumer f got %d deliveries after a clean stop; want 0 (acknowledged work delivered again)", n)
	}

	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	delivered, skipped, dead := consumertest.Totals([]*consumertest.Consumer{a, b, c, e, f}...)
	t.Logf("batch %d: messages %d, upstream duplicates %d, consumers killed %d (2 in the commit-ack window), deliveries handled %d, duplicates skipped %d, dead letters %d; %v",
		batch, len(msgs), upstreamDups, kills, delivered, skipped, dead, r)
	if !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want 0", dead)
	}
	if skipped < upstreamDups {
		t.Errorf("duplicates skipped %d, fewer than the %d upstream duplicates", skipped, upstreamDups)
	}
}

// relayFields are a stream entry's fields as the relay's Redis sink writes
// them for m (sinks/redis), with a row header.
func relayFields(m ledger.Msg) []any {
	return []any{"message_id", m.ID, "event_type", "deposit", "aggregate_id", m.Account, "aggregate_type", "account",
		"content-type", "application/json", "headers", `{"tenant":"t1"}`, "envelope", m.Envelope()}
}
