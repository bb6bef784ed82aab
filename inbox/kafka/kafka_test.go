package kafka

import (
	"context"
	"os"
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

// The end-to-end test's consumers are child processes (consumertest), so
// that they can be killed with SIGKILL.
func TestMain(m *testing.M) { os.Exit(consumertest.Main(m, runChild)) }

const (
	topic = "deposits"
	group = consumertest.Name
)

func runChild(ctx context.Context, in *inbox.Inbox, h inbox.Handler, brokers, _ string, batch int) error {
	r, err := New(in, h, Config{
		Brokers: strings.Split(brokers, ","), Group: group, Topics: []string{topic},
		MaxInFlight: 64, Batch: batch, DrainTimeout: 5 * time.Second, CommitInterval: 200 * time.Millisecond,
		Opts: []kgo.Opt{kgo.SessionTimeout(2 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// TestConsumersKilledExactlyOnce: consumers of one group, over kfake on
// TCP, are killed with SIGKILL (one by itself between its inbox commit and
// its offset commit, one by the test at a random point, one more in the
// commit-ack window) while the producer side sends duplicates, as a relay
// restarted with kill -9 does. Every message's effect must be applied
// exactly once, in per-account order, and a consumer stopped with SIGTERM
// must leave nothing committed for the next one to redo.
func TestConsumersKilledExactlyOnce(t *testing.T) {
	t.Run("per message", func(t *testing.T) { testKilled(t, 0) })
	t.Run("batch", func(t *testing.T) { testKilled(t, 16) })
}

func testKilled(t *testing.T, batch int) {
	ctx := context.Background()
	pg := pgtest.Database(t)
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msgs := ledger.Generate(3000, 40)
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, topic), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(ms []ledger.Msg) {
		recs := make([]*kgo.Record, len(ms))
		for i, m := range ms {
			recs[i] = &kgo.Record{Topic: topic, Key: []byte(m.Account), Value: m.Envelope(),
				Headers: []kgo.RecordHeader{{Key: "message_id", Value: []byte(m.ID)}, {Key: "event_type", Value: []byte("deposit")}}}
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	h := &consumertest.Harness{T: t, Target: strings.Join(cluster.ListenAddrs(), ","), PG: pg, Dir: t.TempDir(), Batch: batch}

	// Upstream duplicates: the relay, killed, resends from its checkpoint.
	upstreamDups := 0
	produce(msgs[:1000])
	produce(msgs[700:1000])
	upstreamDups += 300

	// a dies between its inbox commit and its offset commit, after 50
	// messages: b may take most partitions at the first rebalance, and a
	// must still get to its crash (with 150, one run in three a finished
	// its share first and never crashed).
	a := h.Start("a", 50)
	b := h.Start("b", 0)
	if err := a.WaitExit(t, 60*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("consumer a exited with %v, want killed", err)
	}
	if a.Count("crash") != 1 {
		t.Fatalf("consumer a did not crash in the commit-ack window")
	}
	kills := 1

	produce(msgs[1000:2000])
	produce(msgs[1500:2000])
	upstreamDups += 500
	consumertest.WaitFor(t, "half the messages", 90*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) >= 1500 })
	if err := b.Cmd.Process.Signal(syscall.SIGKILL); err != nil { // at whatever point b is
		t.Fatal(err)
	}
	_ = b.WaitExit(t, 10*time.Second)
	kills++

	c := h.Start("c", 0)
	d := h.Start("d", 100) // also dies in the commit-ack window
	produce(msgs[2000:])
	produce(msgs[2600:2900])
	upstreamDups += 300
	if err := d.WaitExit(t, 90*time.Second); err == nil || d.Count("crash") != 1 {
		t.Fatalf("consumer d exited with %v, crash noted %d times; want one crash", err, d.Count("crash"))
	}
	kills++

	consumertest.WaitFor(t, "every message", 120*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) == len(msgs) })
	// Let c catch up on the upstream duplicates and commit before it stops.
	time.Sleep(2 * time.Second)
	if err := c.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitExit(t, 20*time.Second); err != nil || c.Count("stopped") != 1 {
		t.Fatalf("consumer c on SIGTERM: %v, stopped %d; want a clean stop", err, c.Count("stopped"))
	}

	// A new consumer resumes from the committed offsets: whatever it gets
	// again is a duplicate, never new work.
	e := h.Start("e", 0)
	time.Sleep(4 * time.Second)
	if err := e.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitExit(t, 20*time.Second); err != nil {
		t.Fatalf("consumer e on SIGTERM: %v", err)
	}
	if n := e.Count("processed"); n != 0 {
		t.Errorf("consumer e processed %d messages after a clean stop; want 0 (committed work redone)", n)
	}

	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	delivered, skipped, dead := consumertest.Totals([]*consumertest.Consumer{a, b, c, d, e}...)
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

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{{}, {Brokers: []string{"x"}}, {Brokers: []string{"x"}, Group: "g"}} {
		if _, err := New(nil, nil, cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		}
	}
	if _, err := New(nil, nil, Config{Brokers: []string{"x"}, Group: "g", Topics: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
}
