package redis

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/inbox"
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

// As in the Kafka runner's tests, each consumer is a child process (this
// test binary with INBOX_REDIS_CHILD set), so that it can be killed
// with SIGKILL: by the test, or by itself right after an inbox commit and
// before its ack.
func TestMain(m *testing.M) {
	if os.Getenv("INBOX_REDIS_CHILD") != "" {
		os.Exit(child())
	}
	os.Exit(pgtest.Main(m))
}

func child() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	events, err := os.OpenFile(os.Getenv("INBOX_REDIS_EVENTS"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	note := func(s string) { _, _ = events.WriteString(s + "\n") }
	crashAfter, _ := strconv.Atoi(os.Getenv("INBOX_REDIS_CRASH_AFTER"))
	var processed atomic.Int64
	pool, err := pgxpool.New(ctx, os.Getenv("INBOX_REDIS_PG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	in, err := inbox.New(pool, "billing", inbox.Config{
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		Observer: inbox.Observer{
			Processed: func(inbox.Message, time.Duration) {
				note("processed")
				if n := processed.Add(1); crashAfter > 0 && n == int64(crashAfter) {
					note("crash")
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
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
	}, Config{URL: redisURL(), Stream: os.Getenv("INBOX_REDIS_QUEUE"), Group: "billing", Consumer: os.Getenv("INBOX_REDIS_NAME"),
		MaxInFlight: 32, MinIdle: 2 * time.Second, DrainTimeout: 5 * time.Second})
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
	t     *testing.T
	queue string
	pg    string
	dir   string
	n     int
}

func (h *harness) start(name string, crashAfter int) *consumer {
	h.t.Helper()
	h.n++
	c := &consumer{name: name, events: filepath.Join(h.dir, fmt.Sprintf("%02d-%s.events", h.n, name)), exited: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), "INBOX_REDIS_CHILD=1", "INBOX_REDIS_QUEUE="+h.queue, "INBOX_REDIS_PG="+h.pg,
		"INBOX_REDIS_EVENTS="+c.events, "INBOX_REDIS_NAME="+name, "INBOX_REDIS_CRASH_AFTER="+strconv.Itoa(crashAfter))
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
	stream := fmt.Sprintf("inboxtest:%d:%d", os.Getpid(), time.Now().UnixNano())
	if err := rdb.XGroupCreateMkStream(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
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
	h := &harness{t: t, queue: stream, pg: pg, dir: t.TempDir()}

	upstreamDups := 0
	publish(msgs[:600])
	publish(msgs[400:600])
	upstreamDups += 200
	a := h.start("a", 100) // dies between its inbox commit and its ack
	if err := a.waitExit(t, 60*time.Second); err == nil || a.count("crash") != 1 {
		t.Fatalf("consumer a exited with %v, crash noted %d times; want one crash", err, a.count("crash"))
	}
	kills := 1

	b := h.start("b", 0)
	publish(msgs[600:1100])
	publish(msgs[900:1100])
	upstreamDups += 200
	waitFor(t, "700 messages", 90*time.Second, func() bool { return runs(ctx, t, pool) >= 700 })
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.waitExit(t, 10*time.Second)
	kills++

	c := h.start("c", 150)
	publish(msgs[1100:])
	publish(msgs[1300:1400])
	upstreamDups += 100
	if err := c.waitExit(t, 90*time.Second); err == nil || c.count("crash") != 1 {
		t.Fatalf("consumer c exited with %v, crash noted %d times; want one crash", err, c.count("crash"))
	}
	kills++

	e := h.start("e", 0)
	waitFor(t, "every message", 120*time.Second, func() bool { return runs(ctx, t, pool) == len(msgs) })
	waitFor(t, "every entry acknowledged", 60*time.Second, pendingZero)
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.waitExit(t, 20*time.Second); err != nil || e.count("stopped") != 1 {
		t.Fatalf("consumer e on SIGTERM: %v, stopped %d; want a clean stop", err, e.count("stopped"))
	}
	f := h.start("f", 0)
	time.Sleep(3 * time.Second)
	if err := f.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := f.waitExit(t, 20*time.Second); err != nil {
		t.Fatalf("consumer f on SIGTERM: %v", err)
	}
	if n := f.count("processed") + f.count("duplicate"); n != 0 {
		t.Errorf("consumer f got %d deliveries after a clean stop; want 0 (acknowledged work delivered again)", n)
	}

	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	delivered, skipped, dead := 0, 0, 0
	for _, c := range []*consumer{a, b, c, e, f} {
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

// relayFields are a stream entry's fields as the relay's Redis sink writes
// them for m (sinks/redis), with a row header.
func relayFields(m ledger.Msg) []any {
	return []any{"message_id", m.ID, "event_type", "deposit", "aggregate_id", m.Account, "aggregate_type", "account",
		"content-type", "application/json", "headers", `{"tenant":"t1"}`, "envelope", m.Envelope()}
}
