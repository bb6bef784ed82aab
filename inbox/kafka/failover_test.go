package kafka

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// failoverPrefix names the consumers that run with the Runner's default
// group settings (runChild).
const failoverPrefix = "failover-"

// failoverBound is the failover the defaults must give: their session
// timeout (6s) and a rebalance, with room for a loaded machine, and far
// below franz-go's own session timeout (45s), which the Runner used before.
const failoverBound = 20 * time.Second

// TestFailoverDefaults: two consumers of one group with the Runner's
// default settings, over kfake on TCP (whose minimum session timeout is a
// broker's default, 6s), share the partitions; one is killed with SIGKILL.
// The survivor must take over the dead one's partitions within the
// session timeout and a rebalance, and every message is applied exactly
// once.
func TestFailoverDefaults(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.Database(t)
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msgs := ledger.Generate(1200, 40)
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	sent := 0
	produce := func(n int) {
		t.Helper()
		var recs []*kgo.Record
		for _, m := range msgs[sent:min(sent+n, len(msgs))] {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(m.Account), Value: m.Envelope(),
				Headers: []kgo.RecordHeader{{Key: "message_id", Value: []byte(m.ID)}, {Key: "event_type", Value: []byte("deposit")}}})
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		sent += len(recs)
	}
	h := &consumertest.Harness{T: t, Target: strings.Join(cluster.ListenAddrs(), ","), PG: pg, Dir: t.TempDir()}
	a := h.Start(failoverPrefix+"a", 0)
	b := h.Start(failoverPrefix+"b", 0)

	// Both hold partitions once both have processed something; then let
	// them finish what was sent, so the group is settled before the kill.
	consumertest.WaitFor(t, "both consumers processing", 90*time.Second, func() bool {
		if sent < len(msgs)/2 {
			produce(10)
		}
		time.Sleep(200 * time.Millisecond)
		return a.Count("processed") > 0 && b.Count("processed") > 0
	})
	consumertest.WaitFor(t, "every message sent so far", 60*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) == sent })

	if err := a.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed, beforeKill := time.Now(), sent
	_ = a.WaitExit(t, 10*time.Second)
	produce(len(msgs)) // the rest, over every account and so every partition
	consumertest.WaitFor(t, "every message after the kill", 120*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) == len(msgs) })
	failover := time.Since(killed)

	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	delivered, skipped, dead := consumertest.Totals(a, b)
	t.Logf("failover with the default settings: %.1fs from the SIGKILL until the survivor had applied every message; messages %d (%d after the kill), deliveries %d, duplicates skipped %d, dead letters %d; %v",
		failover.Seconds(), len(msgs), len(msgs)-beforeKill, delivered, skipped, dead, r)
	if !r.ExactlyOnce() {
		t.Errorf("not exactly once: %v", r)
	}
	if failover > failoverBound {
		t.Errorf("failover took %.1fs with the default settings, want at most %v (the session timeout and a rebalance)", failover.Seconds(), failoverBound)
	}
}
