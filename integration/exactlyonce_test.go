package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// exactlyOnce is the environment of a relay in sink.kafka.exactly_once mode.
var exactlyOnce = "OUTBOXRELAY_SINK_KAFKA_EXACTLY_ONCE=true"

// consumeCommitted reads topics as a consumer with isolation.level=read_committed.
func (e *env) consumeCommitted(topics ...string) *consumer {
	e.t.Helper()
	return e.consumeWith([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, topics...)
}

// checkExactlyOnce waits for every id, then a little longer for late
// repeats, and fails on a duplicate or on an aggregate out of commit order.
func checkExactlyOnce(t *testing.T, c *consumer, ids []string, what string) {
	t.Helper()
	c.waitIDs(ids, 120*time.Second)
	time.Sleep(time.Second)
	recs := c.records()
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	last := map[string]int{}
	disorder := 0
	for _, r := range recs {
		i, ok := at[r.Headers["message_id"]]
		if !ok {
			t.Errorf("%s: record %s is not in the ledger", what, r.Headers["message_id"])
			continue
		}
		if prev, seen := last[r.Key]; seen && i < prev {
			disorder++
		}
		last[r.Key] = i
	}
	d := duplicates(recs)
	t.Logf("%s (exactly-once, read_committed): rows %d, records %d, lost 0, duplicates %d, out of order %d", what, len(ids), len(recs), d, disorder)
	if d != 0 || len(recs) != len(ids) || disorder != 0 {
		t.Errorf("%s: %d duplicates, %d records for %d rows, %d out of order; want every row exactly once in order", what, d, len(recs), len(ids), disorder)
	}
}

// TestExactlyOnceKillNine crashes the relay ten times while 20,000 rows are
// written: a read_committed consumer sees each row once.
func TestExactlyOnceKillNine(t *testing.T) {
	e := newEnv(t)
	c := e.consumeCommitted("outbox.order")
	wait := e.insertLoop(200, 100, 10*time.Millisecond)
	for kills := 0; kills < 10; kills++ {
		p := e.start(exactlyOnce)
		time.Sleep(time.Duration(300+rand.IntN(900)) * time.Millisecond)
		p.kill()
	}
	ids := wait()
	p := e.start(exactlyOnce)
	checkExactlyOnce(t, c, ids, "kill -9 x10")
	p.stop()
	if len(ids) != 20000 {
		t.Fatalf("inserted %d rows, want 20000", len(ids))
	}
	kcatReadCommitted(t, e.brokers, "outbox.order", ids)
}

// kcatReadCommitted reads topic with kcat (librdkafka) in read_committed
// mode, to its end, and requires every id exactly once: an independent
// client's view of the transactions.
func kcatReadCommitted(t *testing.T, brokers, topic string, ids []string) {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		missingClient(t, "kcat", "apt-get install kcat (.ci/services does)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-C", "-J", "-q", "-e", "-b", brokers, "-t", topic,
		"-o", "beginning", "-X", "isolation.level=read_committed").Output()
	if err != nil {
		t.Fatalf("kcat read_committed: %v", err)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m struct {
			Headers []string `json:"headers"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("kcat printed %q: %v", line, err)
		}
		for i := 0; i+1 < len(m.Headers); i += 2 {
			if m.Headers[i] == "message_id" {
				seen[m.Headers[i+1]]++
			}
		}
	}
	lost, dup := 0, 0
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			lost++
		case n > 1:
			dup++
		}
	}
	if lost > 0 || dup > 0 || len(seen) != len(ids) {
		t.Fatalf("kcat read_committed: %d ids read, %d lost, %d repeated, of %d committed", len(seen), lost, dup, len(ids))
	}
	t.Logf("kcat read_committed: %d of %d ids, each once", len(seen), len(ids))
}

// TestExactlyOnceKafkaOutage stops the broker mid-stream and starts it again
// on the same port and data directory.
func TestExactlyOnceKafkaOutage(t *testing.T) {
	e := newEnv(t)
	newCluster := e.restartableKafka()
	cluster := newCluster()
	e.brokers = cluster.ListenAddrs()[0]
	p := e.start(exactlyOnce)
	p.waitLog(`"streaming"`, 30*time.Second)
	wait := e.insertLoop(100, 50, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	cluster.Close()
	time.Sleep(3 * time.Second)
	cluster = newCluster()
	t.Cleanup(cluster.Close)
	ids := wait()
	c := e.consumeCommitted("outbox.order")
	checkExactlyOnce(t, c, ids, "kafka outage")
	p.stop()
}

// TestExactlyOncePostgresRestart restarts PostgreSQL while rows are written.
func TestExactlyOncePostgresRestart(t *testing.T) {
	e := newEnv(t)
	c := e.consumeCommitted("outbox.order")
	p := e.start(exactlyOnce)
	p.waitLog(`"streaming"`, 30*time.Second)
	wait := e.insertLoop(100, 50, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	ids := wait()
	checkExactlyOnce(t, c, ids, "postgres restart")
	p.waitLog("reconnecting", time.Second)
	p.stop()
}

// TestExactlyOnceStandbyZombie freezes the active relay, lets the standby
// take over, then wakes the frozen one up: it is fenced off, and nothing it
// still held reaches consumers.
func TestExactlyOnceStandbyZombie(t *testing.T) {
	e := newEnv(t)
	c := e.consumeCommitted("outbox.order")
	a := e.start(exactlyOnce)
	a.waitLog(`"streaming"`, 30*time.Second)
	b := e.start(exactlyOnce)
	b.waitLog("waiting as standby", 30*time.Second)
	wait := e.insertLoop(100, 50, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The frozen relay's connection is cut, as a network partition would.
	e.exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'outboxrelay'`)
	b.waitLog(`"streaming"`, 30*time.Second)
	time.Sleep(time.Second)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ids := wait()
	checkExactlyOnce(t, c, ids, "standby takeover, zombie woken")
	b.stop()
}

// TestExactlyOnceTransactionLargerThanWindow: a transaction with more outbox
// rows (or bytes) than relay.max_inflight (max_inflight_bytes) cannot be
// published whole. The relay stops by itself with the error naming the fix,
// a SIGTERM does not turn that into a clean exit, and after the fix (a
// larger window) every row arrives once. Before, the error waited on a drain
// that could never finish (30 s of silence; for bytes, the relay waited for
// good), and a SIGTERM meanwhile exited 0 without it.
func TestExactlyOnceTransactionLargerThanWindow(t *testing.T) {
	for _, tc := range []struct{ window, fix string }{
		{"relay:\n  max_inflight: 50\n", "raise relay.max_inflight above the largest transaction"},
		{"relay:\n  max_inflight_bytes: 20000\n", "raise relay.max_inflight_bytes above the largest transaction"},
	} {
		t.Run(strings.TrimSuffix(strings.Fields(tc.window)[1], ":"), func(t *testing.T) {
			e := newEnv(t)
			e.extra = tc.window
			c := e.consumeCommitted("outbox.order")
			p := e.start(exactlyOnce)
			p.waitLog(`"streaming"`, 30*time.Second)
			ids := e.insert("outbox", "order", "1", 20)
			c.waitIDs(ids, 60*time.Second)
			ids = append(ids, e.insert("outbox", "order", "2", 200)...)

			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Errorf("relay did not stop by itself within 10s of a 200-row transaction larger than its window")
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-p.done:
				case <-time.After(60 * time.Second):
					t.Fatal("relay did not exit within 60s of SIGTERM")
				}
			}
			out := p.out.String()
			code := p.cmd.ProcessState.ExitCode()
			t.Logf("relay exited with code %d", code)
			if code == 0 || strings.Contains(out, "stopped cleanly") {
				t.Errorf("relay exited %d (stopped cleanly: %v) after a transaction it cannot publish; want a non-zero exit with the error", code, strings.Contains(out, "stopped cleanly"))
			}
			if !strings.Contains(out, tc.fix) {
				t.Errorf("relay did not say %q:\n%s", tc.fix, tail(out, 10))
			}

			e.extra = "relay:\n  max_inflight: 1000\n  max_inflight_bytes: 10000000\n"
			p = e.start(exactlyOnce)
			checkExactlyOnce(t, c, ids, "transaction larger than the old window")
			p.stop()
		})
	}
}

// TestExactlyOnceWindowFullWhileBrokerDown: with the broker down, one
// transaction in flight and the next one's rows filling the rest of the
// window, the reader reads on and drops what it cannot hold. Those rows of
// the open transaction are held back for its commit, which was dropped, so
// they are never handed to the broker: once the broker is back and has
// acknowledged what it was handed, the session must resume from the slot.
// Before, it waited for the open transaction's rows to be acknowledged too,
// and relayed nothing more, for good, with no error.
func TestExactlyOnceWindowFullWhileBrokerDown(t *testing.T) {
	e := newEnv(t)
	newCluster := e.restartableKafka()
	cluster := newCluster()
	e.brokers = cluster.ListenAddrs()[0]
	e.extra = "relay:\n  max_inflight: 50\n"
	p := e.start(exactlyOnce)
	p.waitLog(`"streaming"`, 30*time.Second)
	// The first transaction reads the position back from the broker.
	ids := e.insert("outbox", "order", "0", 30)
	e.consumeCommitted("outbox.order").waitIDs(ids, 60*time.Second)
	cluster.Close()
	// One transaction in flight, the next fills the window, the rest is dropped.
	for i := 1; i <= 4; i++ {
		ids = append(ids, e.insert("outbox", "order", fmt.Sprint(i), 30)...)
	}
	p.waitLog("dropping the changes received from now on", 30*time.Second)
	cluster = newCluster()
	t.Cleanup(cluster.Close)
	c := e.consumeCommitted("outbox.order")
	checkExactlyOnce(t, c, ids, "window full while the broker was down")
	if !strings.Contains(p.out.String(), `"msg":"resuming from the slot"`) {
		t.Errorf("relay did not resume from the slot after dropping changes:\n%s", tail(p.out.String(), 20))
	}
	p.stop()
}
