// Package consumertest is the runners' end-to-end test scaffolding: each
// consumer is a child process (the test binary, re-run with
// INBOX_TEST_CHILD set), so that it can be killed with SIGKILL like a real
// one, by the test at a random point or by itself right after an inbox
// commit and before the broker ack. Each child appends its outcomes to an
// events file, one line per write, which survives the kill.
package consumertest

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

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

const (
	envChild  = "INBOX_TEST_CHILD"
	envTarget = "INBOX_TEST_TARGET"
	envPG     = "INBOX_TEST_PG"
	envEvents = "INBOX_TEST_EVENTS"
	envName   = "INBOX_TEST_NAME"
	envBatch  = "INBOX_TEST_BATCH"
	envCrash  = "INBOX_TEST_CRASH_AFTER"
)

// Name is the inbox's consumer name in every child.
const Name = "billing"

// Child is what a child runs: the broker's runner over in with h, until
// ctx ends. target is the Harness's (brokers, queue, stream), name the
// child's, batch the runner's batch size (0: one message at a time).
type Child func(ctx context.Context, in *inbox.Inbox, h inbox.Handler, target, name string, batch int) error

// Main runs run when the process is a child, the tests otherwise; call it
// from TestMain.
func Main(m *testing.M, run Child) int {
	if os.Getenv(envChild) != "" {
		return child(run)
	}
	return pgtest.Main(m)
}

// child runs one consumer until SIGTERM. INBOX_TEST_CRASH_AFTER=n kills
// the process with SIGKILL inside the Processed hook of the n-th message:
// its transaction has committed, its ack has not.
func child(run Child) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	events, err := os.OpenFile(os.Getenv(envEvents), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	note := func(s string) { _, _ = events.WriteString(s + "\n") }
	crashAfter, _ := strconv.Atoi(os.Getenv(envCrash))
	batch, _ := strconv.Atoi(os.Getenv(envBatch))
	var processed atomic.Int64
	pool, err := pgxpool.New(ctx, os.Getenv(envPG))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	in, err := inbox.New(pool, Name, inbox.Config{
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
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return ledger.Apply(ctx, tx, m.ID, m.Payload, true)
	}
	if err := run(ctx, in, h, os.Getenv(envTarget), os.Getenv(envName), batch); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	note("stopped")
	return 0
}

// Harness starts consumers against one target and one database.
type Harness struct {
	T      *testing.T
	Target string // handed to each child's Child
	PG     string // the database's URL
	Dir    string // where the events files go
	Batch  int    // the children's batch size
	n      int
}

// Consumer is one started child.
type Consumer struct {
	Name   string
	Cmd    *exec.Cmd
	events string
	exited chan error
}

// Start starts a child named name; crashAfter > 0 makes it kill itself in
// the commit-ack window of its crashAfter-th processed message.
func (h *Harness) Start(name string, crashAfter int) *Consumer {
	h.T.Helper()
	h.n++
	c := &Consumer{Name: name, events: filepath.Join(h.Dir, fmt.Sprintf("%02d-%s.events", h.n, name)), exited: make(chan error, 1)}
	c.Cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.Cmd.Env = append(os.Environ(), envChild+"=1", envTarget+"="+h.Target, envPG+"="+h.PG, envEvents+"="+c.events,
		envName+"="+name, envBatch+"="+strconv.Itoa(h.Batch), envCrash+"="+strconv.Itoa(crashAfter))
	c.Cmd.Stdout, c.Cmd.Stderr = os.Stderr, os.Stderr
	if err := c.Cmd.Start(); err != nil {
		h.T.Fatal(err)
	}
	go func() { c.exited <- c.Cmd.Wait() }()
	h.T.Cleanup(func() {
		if c.Cmd.ProcessState == nil {
			_ = c.Cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// Count returns how many lines of the consumer's events say what
// (processed, duplicate, dead-lettered, crash, stopped).
func (c *Consumer) Count(what string) int {
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

// WaitExit waits for the child to exit and returns its error; the test
// fails if it does not exit within the time given.
func (c *Consumer) WaitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-c.exited:
		return err
	case <-time.After(within):
		t.Fatalf("consumer %s did not exit within %v", c.Name, within)
		return nil
	}
}

// Totals sums the consumers' events: deliveries handled (processed or
// duplicate), duplicates skipped and dead letters.
func Totals(cs ...*Consumer) (delivered, skipped, dead int) {
	for _, c := range cs {
		delivered += c.Count("processed") + c.Count("duplicate")
		skipped += c.Count("duplicate")
		dead += c.Count("dead-lettered")
	}
	return delivered, skipped, dead
}

// Runs returns how many distinct messages have a ledger row.
func Runs(ctx context.Context, t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(DISTINCT message_id) FROM ledger").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// WaitFor polls cond until it holds; the test fails after within.
func WaitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Unreachable fails the test when CI=true, where every broker must be up,
// and skips it otherwise: what, the broker, did not answer with err.
func Unreachable(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v", what, err)
	}
	t.Skipf("%s not reachable (CI=true makes this a failure): %v", what, err)
}
