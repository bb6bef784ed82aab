package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestRunReturnsAndLeavesNoGoroutine: a Runner in this process consumes a
// backlog from kfake over TCP, is stopped by its context while records
// still arrive, returns within its drain bound and leaves no goroutine
// behind (its workers, its committer, franz-go's client).
func TestRunReturnsAndLeavesNoGoroutine(t *testing.T) {
	ctx := context.Background()
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
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "leak"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	produce := func(ms []ledger.Msg) error {
		recs := make([]*kgo.Record, len(ms))
		for i, m := range ms {
			recs[i] = &kgo.Record{Topic: "leak", Key: []byte(m.Account), Value: m.Envelope()}
		}
		return prod.ProduceSync(ctx, recs...).FirstErr()
	}
	if err := produce(msgs[:300]); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	r, err := New(in, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return ledger.Apply(ctx, tx, m.ID, m.Payload, false)
	}, Config{Brokers: cluster.ListenAddrs(), Group: "billing", Topics: []string{"leak"}, DrainTimeout: 5 * time.Second,
		Opts: []kgo.Opt{kgo.SessionTimeout(2 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	consumertest.WaitFor(t, "200 messages", 60*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) >= 200 })
	produced := make(chan error, 1)
	go func() { produced <- produce(msgs[300:]) }() // still arriving when the stop comes
	stop()
	stopped := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end (drain 5s)")
	}
	t.Logf("stopped after %d of 400 messages in %v", consumertest.Runs(ctx, t, pool), time.Since(stopped))
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	prod.Close()
	cluster.Close()
	pool.Close()
	goleak.VerifyNone(t, before)
}
