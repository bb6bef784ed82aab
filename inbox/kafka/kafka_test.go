package kafka

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// The end-to-end tests run each consumer as a child process (this test
// binary with INBOX_KAFKA_CHILD set), so that it can be killed with
// SIGKILL like a real one: by the test at a random point, or by itself
// right after an inbox commit and before the offset commit.
func TestMain(m *testing.M) {
	if os.Getenv("INBOX_KAFKA_CHILD") != "" {
		os.Exit(child())
	}
	os.Exit(pgtest.Main(m))
}

const (
	topic = "deposits"
	group = "billing"
)

// child runs one consumer until SIGTERM. Each outcome is appended to the
// events file as it happens (one write per line survives a SIGKILL).
// INBOX_KAFKA_CRASH_AFTER=n kills the process with SIGKILL inside the
// Processed hook of the n-th message: its transaction has committed, its
// offset has not.
func child() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	events, err := os.OpenFile(os.Getenv("INBOX_KAFKA_EVENTS"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	note := func(s string) { _, _ = events.WriteString(s + "\n") }
	crashAfter, _ := strconv.Atoi(os.Getenv("INBOX_KAFKA_CRASH_AFTER"))
	var processed atomic.Int64
	pool, err := pgxpool.New(ctx, os.Getenv("INBOX_KAFKA_PG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	in, err := inbox.New(pool, group, inbox.Config{
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		Observer: inbox.Observer{
			Processed: func(inbox.Message, time.Duration) {
				note("processed")
				if n := processed.Add(1); crashAfter > 0 && n == int64(crashAfter) {
					note("crash")
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {} // the signal is on its way
				}
			},
			Duplicate:    func(inbox.Message) { note("duplicate") },
			DeadLettered: func(inbox.Message, error) { note("dead-lettered") },
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := New(in, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return ledger.Apply(ctx, tx, m.ID, m.Payload, true)
	}, Config{
		Brokers: strings.Split(os.Getenv("INBOX_KAFKA_BROKERS"), ","), Group: group, Topics: []string{topic},
		MaxInFlight: 64, DrainTimeout: 5 * time.Second, CommitInterval: 200 * time.Millisecond,
		Opts: []kgo.Opt{kgo.SessionTimeout(2 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	note("stopped")
	return 0
}

type consumer struct {
	name   string
	cmd    *exec.Cmd
	events string
	exited chan error
}

type harness struct {
	t       *testing.T
	brokers string
	pg      string
	dir     string
	n       int
}

func (h *harness) start(name string, crashAfter int) *consumer {
	h.t.Helper()
	h.n++
	c := &consumer{name: name, events: filepath.Join(h.dir, fmt.Sprintf("%02d-%s.events", h.n, name)), exited: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), "INBOX_KAFKA_CHILD=1", "INBOX_KAFKA_BROKERS="+h.brokers, "INBOX_KAFKA_PG="+h.pg,
		"INBOX_KAFKA_EVENTS="+c.events, "INBOX_KAFKA_CRASH_AFTER="+strconv.Itoa(crashAfter))
	c.cmd.Stdout, c.cmd.Stderr = os.Stderr, os.Stderr
	if err := c.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	h.t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// count returns how many lines of the consumer's events say what.
func (c *consumer) count(what string) int {
	f, err := os.Open(c.events)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == what {
			n++
		}
	}
	return n
}

func (c *consumer) waitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-c.exited:
		return err
	case <-time.After(within):
		t.Fatalf("consumer %s did not exit within %v", c.name, within)
		return nil
	}
}

func runs(ctx context.Context, t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(DISTINCT message_id) FROM ledger").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConsumersKilledExactlyOnce: consumers of one group, over kfake on
// TCP, are killed with SIGKILL (one by itself between its inbox commit and
// its offset commit, one by the test at a random point, one more in the
// commit-ack window) while the producer side sends duplicates, as a relay
// restarted with kill -9 does. Every message's effect must be applied
// exactly once, in per-account order, and a consumer stopped with SIGTERM
// must leave nothing committed for the next one to redo.
func TestConsumersKilledExactlyOnce(t *testing.T) {
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
	h := &harness{t: t, brokers: strings.Join(cluster.ListenAddrs(), ","), pg: pg, dir: t.TempDir()}

	// Upstream duplicates: the relay, killed, resends from its checkpoint.
	upstreamDups := 0
	produce(msgs[:1000])
	produce(msgs[700:1000])
	upstreamDups += 300

	a := h.start("a", 150) // dies between its inbox commit and its offset commit
	b := h.start("b", 0)
	if err := a.waitExit(t, 60*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("consumer a exited with %v, want killed", err)
	}
	if a.count("crash") != 1 {
		t.Fatalf("consumer a did not crash in the commit-ack window")
	}
	kills := 1

	produce(msgs[1000:2000])
	produce(msgs[1500:2000])
	upstreamDups += 500
	waitFor(t, "half the messages", 90*time.Second, func() bool { return runs(ctx, t, pool) >= 1500 })
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil { // at whatever point b is
		t.Fatal(err)
	}
	_ = b.waitExit(t, 10*time.Second)
	kills++

	c := h.start("c", 0)
	d := h.start("d", 200) // also dies in the commit-ack window
	produce(msgs[2000:])
	produce(msgs[2600:2900])
	upstreamDups += 300
	if err := d.waitExit(t, 90*time.Second); err == nil || d.count("crash") != 1 {
		t.Fatalf("consumer d exited with %v, crash noted %d times; want one crash", err, d.count("crash"))
	}
	kills++

	waitFor(t, "every message", 120*time.Second, func() bool { return runs(ctx, t, pool) == len(msgs) })
	// Let c catch up on the upstream duplicates and commit before it stops.
	time.Sleep(2 * time.Second)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.waitExit(t, 20*time.Second); err != nil || c.count("stopped") != 1 {
		t.Fatalf("consumer c on SIGTERM: %v, stopped %d; want a clean stop", err, c.count("stopped"))
	}

	// A new consumer resumes from the committed offsets: whatever it gets
	// again is a duplicate, never new work.
	e := h.start("e", 0)
	time.Sleep(4 * time.Second)
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.waitExit(t, 20*time.Second); err != nil {
		t.Fatalf("consumer e on SIGTERM: %v", err)
	}
	if n := e.count("processed"); n != 0 {
		t.Errorf("consumer e processed %d messages after a clean stop; want 0 (committed work redone)", n)
	}

	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	delivered, skipped, dead := 0, 0, 0
	for _, c := range []*consumer{a, b, c, d, e} {
		delivered += c.count("processed") + c.count("duplicate")
		skipped += c.count("duplicate")
		dead += c.count("dead-lettered")
	}
	t.Logf("messages %d, upstream duplicates %d, consumers killed %d (2 in the commit-ack window), deliveries handled %d, duplicates skipped %d, dead letters %d; %v",
		len(msgs), upstreamDups, kills, delivered, skipped, dead, r)
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
