package kafka

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

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

// runChild runs a consumer with short group timeouts, or, for a consumer
// named failover-*, with the Runner's defaults (TestFailoverDefaults).
func runChild(ctx context.Context, in *inbox.Inbox, h inbox.Handler, brokers, name string, batch int) error {
	opts := []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	if !strings.HasPrefix(name, failoverPrefix) {
		opts = append(opts, kgo.SessionTimeout(2*time.Second), kgo.HeartbeatInterval(200*time.Millisecond))
	}
	r, err := New(in, h, Config{
		Brokers: strings.Split(brokers, ","), Group: group, Topics: []string{topic},
		MaxInFlight: 64, Batch: batch, DrainTimeout: 5 * time.Second, CommitInterval: 200 * time.Millisecond,
		Opts: opts,
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
	// Stop c once it has caught up on the upstream duplicates and committed
	// every record: the group's offsets, not a pause, say so.
	consumertest.WaitFor(t, "every record committed", 60*time.Second, func() bool { return uncommitted(t, cluster.ListenAddrs(), topic) == 0 })
	if err := c.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitExit(t, 20*time.Second); err != nil || c.Count("stopped") != 1 {
		t.Fatalf("consumer c on SIGTERM: %v, stopped %d; want a clean stop", err, c.Count("stopped"))
	}
	// What e would get again is what the group has not committed now,
	// whether or not e is consuming by the time it is stopped.
	if n := uncommitted(t, cluster.ListenAddrs(), topic); n != 0 {
		t.Errorf("%d records not committed after c's clean stop; want 0 (committed offsets went back)", n)
	}

	// A new consumer resumes from the committed offsets: it gets nothing
	// again, neither new work nor a duplicate.
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
	if n := e.Count("duplicate"); n != 0 {
		t.Errorf("consumer e got %d duplicates after a clean stop with every record committed; want 0", n)
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
	_, err := New(nil, nil, Config{Brokers: []string{"x"}, Group: "g", Topics: []string{"t"}, SessionTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "HeartbeatInterval 1s is not below SessionTimeout 1s") {
		t.Errorf("New with the default heartbeat and a 1s session timeout: %v, want the heartbeat refused", err)
	}
}

// uncommitted is how many records of topic the group has not committed:
// the sum over its partitions of the end offset less the group's
// committed offset (the whole partition where the group committed none).
// A record a member has fetched, is running or has finished but not yet
// committed counts; the broker knows nothing of those.
func uncommitted(t *testing.T, brokers []string, topic string) int64 {
	t.Helper()
	// Kafka 2.8's versions: OffsetFetch names its group and topics at the
	// top (v7), before groups (v8) and topic ids (v10).
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MaxVersions(kversion.V2_8_0()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil || len(mresp.Topics) != 1 {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	var parts []int32
	for _, p := range mresp.Topics[0].Partitions {
		parts = append(parts, p.Partition)
	}

	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range parts {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = p, -1 // the end offset
		lt.Partitions = append(lt.Partitions, lp)
	}
	lo.Topics = append(lo.Topics, lt)
	lresp, err := lo.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	end := map[int32]int64{}
	for _, rt := range lresp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				t.Fatalf("end offset of %s/%d: %v", topic, rp.Partition, err)
			}
			end[rp.Partition] = rp.Offset
		}
	}

	of := kmsg.NewPtrOffsetFetchRequest()
	of.Group = group
	ot := kmsg.NewOffsetFetchRequestTopic()
	ot.Topic, ot.Partitions = topic, parts
	of.Topics = append(of.Topics, ot)
	oresp, err := of.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("committed offsets of group %s: %v", group, err)
	}
	committed := map[int32]int64{}
	if err := kerr.ErrorForCode(oresp.ErrorCode); errors.Is(err, kerr.GroupIDNotFound) {
		oresp.Topics = nil // no member has joined yet: nothing committed
	} else if err != nil {
		t.Fatalf("committed offsets of group %s: %v", group, err)
	}
	for _, rt := range oresp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				t.Fatalf("committed offset of %s/%d: %v", topic, rp.Partition, err)
			}
			committed[rp.Partition] = rp.Offset
		}
	}

	var n int64
	for _, p := range parts {
		e, ok := end[p]
		if !ok {
			t.Fatalf("no end offset for %s/%d", topic, p)
		}
		n += e - max(committed[p], 0) // -1: none committed; the log starts at 0
	}
	return n
}
