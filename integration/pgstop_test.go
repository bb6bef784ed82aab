package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPostgresStopsDuringBrokerOutage: while the broker is down and the
// relay holds unacknowledged rows, `pg_ctl stop -m fast` still finishes, the
// relay confirms none of those rows, and once PostgreSQL and the broker are
// back every committed row arrives.
//
// It needs a server of its own: stopping the shared one would break the
// other tests.
func TestPostgresStopsDuringBrokerOutage(t *testing.T) {
	srv, _ := startServer(t, map[string]string{"max_wal_senders": "10", "max_replication_slots": "10"})
	e := newEnvOn(t, srv)
	newCluster := e.restartableKafka()
	cluster := newCluster()
	e.brokers = cluster.ListenAddrs()[0]
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	var ids []string
	for i := range 5 {
		ids = append(ids, e.insert("outbox", "order", strconv.Itoa(i), 20)...)
	}
	e.consume("outbox.order").waitIDs(ids, 30*time.Second)
	cluster.Close()
	t.Log("broker stopped")
	var outageStart string
	if err := e.db.QueryRow(t.Context(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&outageStart); err != nil {
		t.Fatal(err)
	}
	var unacked []string
	for i := range 5 {
		unacked = append(unacked, e.insert("outbox", "order", strconv.Itoa(i), 20)...)
	}
	ids = append(ids, unacked...)
	// Everything committed has reached the relay, which cannot get it acknowledged.
	var walsender int
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sent bool
		err := e.db.QueryRow(t.Context(), `SELECT pid, sent_lsn >= pg_current_wal_insert_lsn() FROM pg_stat_replication
			WHERE application_name = 'outboxrelay'`).Scan(&walsender, &sent)
		if err == nil && sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the walsender did not send the rows within 30s (%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)

	cpu := sampleCPU(walsender)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	started := time.Now()
	err := srv.Shutdown(ctx)
	took := time.Since(started)
	cancel()
	busy := cpu()
	t.Logf("pg_ctl stop -m fast with %d rows unacknowledged took %s; walsender CPU while stopping: %s", len(unacked), took.Round(10*time.Millisecond), busy)
	// A correctness bound, not a speed claim: without the fix the stop
	// never finishes while the relay is connected.
	if err != nil || took > 15*time.Second {
		p.kill() // the walsender's client gone, PostgreSQL can finish stopping
		t.Fatalf("PostgreSQL did not stop within 15s while the broker was down (took %s): %v", took.Round(10*time.Millisecond), err)
	}
	if !strings.Contains(p.out.String(), "closing the replication connection without confirming") {
		t.Errorf("relay did not log why it closed the replication connection")
	}
	select {
	case <-p.done:
		t.Fatalf("relay exited (%v) while PostgreSQL was down; it must reconnect", p.err)
	default:
	}

	if err := srv.StartAgain(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.db = connectT(t, e.dbURL)
	// PostgreSQL 15 may bring the slot back to an older position after a
	// restart; it must never have gone past the first unacknowledged row.
	var confirmedPast bool
	if err := e.db.QueryRow(t.Context(), "SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxrelay'", outageStart).Scan(&confirmedPast); err != nil {
		t.Fatal(err)
	}
	if confirmedPast {
		t.Errorf("slot confirmed at %s, past %s where the unacknowledged rows begin", e.slotLSN(), outageStart)
	}
	cluster = newCluster()
	t.Cleanup(cluster.Close)
	t.Log("PostgreSQL and broker started again")
	ids = append(ids, e.insertRetry("outbox", "order", "9", 20)...)
	c := e.consume("outbox.order")
	recs := c.waitIDs(ids, 120*time.Second)
	p.stop()
	t.Logf("rows committed %d, delivered %d, lost 0, duplicates %d (records %d)", len(ids), len(ids), duplicates(recs), len(recs))
}

// sampleCPU samples the CPU time of process pid until the returned function
// is called, and returns the share of one core it used while it existed.
func sampleCPU(pid int) func() string {
	var mu sync.Mutex
	var first, last, ticks0, ticks1 = time.Time{}, time.Time{}, 0, 0
	stop := make(chan struct{})
	done := make(chan struct{})
	read := func() (int, bool) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		utime, _ := strconv.Atoi(f[11])
		stime, _ := strconv.Atoi(f[12])
		return utime + stime, true
	}
	go func() {
		defer close(done)
		for {
			if n, ok := read(); ok {
				mu.Lock()
				if first.IsZero() {
					first, ticks0 = time.Now(), n
				}
				last, ticks1 = time.Now(), n
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() string {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		if d := last.Sub(first); d > 0 {
			// Clock ticks are 1/100 s on Linux.
			return fmt.Sprintf("%.0f%% of a core over %s", float64(ticks1-ticks0)/100/d.Seconds()*100, d.Round(100*time.Millisecond))
		}
		return "not measured"
	}
}

// TestPostgresStopsWhileCaughtUp: a fast shutdown terminates the relay's
// regular sessions (57P01) before its walsender waits for the relay to
// confirm the end of the WAL, the shutdown checkpoint included, which the
// relay can no longer record. Finding the server refusing new sessions as
// shutting down, the relay confirms unrecorded, so PostgreSQL stops; after
// the restart the relay comes up again (no "re-created" refusal) and every
// row arrives.
func TestPostgresStopsWhileCaughtUp(t *testing.T) {
	srv, _ := startServer(t, map[string]string{"max_wal_senders": "10", "max_replication_slots": "10"})
	e := newEnvOn(t, srv)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	var ids []string
	for i := range 5 {
		ids = append(ids, e.insert("outbox", "order", strconv.Itoa(i), 20)...)
	}
	c.waitIDs(ids, 30*time.Second)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	started := time.Now()
	err := srv.Shutdown(ctx)
	took := time.Since(started)
	cancel()
	t.Logf("pg_ctl stop -m fast with the relay caught up took %s", took.Round(10*time.Millisecond))
	// A correctness bound, not a speed claim: a relay that withholds the
	// confirmation keeps PostgreSQL from stopping at all.
	if err != nil || took > 15*time.Second {
		p.kill()
		t.Fatalf("PostgreSQL did not stop within 15s with the relay caught up (took %s): %v", took.Round(10*time.Millisecond), err)
	}
	if !strings.Contains(p.out.String(), "confirming progress unrecorded") {
		t.Errorf("relay did not log that it confirmed unrecorded while PostgreSQL shut down")
	}
	if err := srv.StartAgain(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.db = connectT(t, e.dbURL)
	ids = append(ids, e.insertRetry("outbox", "order", "9", 20)...)
	recs := c.waitIDs(ids, 120*time.Second)
	select {
	case <-p.done:
		t.Fatalf("relay exited (%v) after PostgreSQL restarted; it must resume", p.err)
	default:
	}
	p.stop()
	t.Logf("rows committed %d, delivered %d, lost 0, duplicates %d (records %d)", len(ids), len(ids), duplicates(recs), len(recs))
}

// TestPostgresStopsWithFullWindow: with the broker down and the in-flight
// window full (relay.max_inflight 100, 12,000 rows behind it), `pg_ctl stop
// -m fast` still finishes, and once PostgreSQL and the broker are back every
// committed row arrives. Before, the relay stopped reading while its window
// was full, and the stop did not finish until the relay was killed.
func TestPostgresStopsWithFullWindow(t *testing.T) {
	srv, _ := startServer(t, map[string]string{"max_wal_senders": "10", "max_replication_slots": "10"})
	e := newEnvOn(t, srv)
	e.extra = "relay:\n  max_inflight: 100\n"
	newCluster := e.restartableKafka()
	cluster := newCluster()
	e.brokers = cluster.ListenAddrs()[0]
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	ids := e.insert("outbox", "order", "0", 20)
	e.consume("outbox.order").waitIDs(ids, 30*time.Second)
	cluster.Close()
	t.Log("broker stopped")
	var outageStart string
	if err := e.db.QueryRow(t.Context(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&outageStart); err != nil {
		t.Fatal(err)
	}
	// Far more than the window and the sockets' buffers hold: the
	// walsender has more to send than the relay takes while it is full.
	const txs, perTx = 6, 2000
	var unacked []string
	for i := range txs {
		rows, err := e.db.Query(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', (g % 50)::text, 'order.created', jsonb_build_object('seq', g, 'pad', repeat('x', 400))
			FROM generate_series(1, $1) g RETURNING id::text`, perTx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
		unacked = append(unacked, got...)
	}
	ids = append(ids, unacked...)
	if len(unacked) != txs*perTx {
		t.Fatalf("committed %d rows during the outage, want %d", len(unacked), txs*perTx)
	}
	// Let the window fill and stay full for longer than plain backpressure.
	time.Sleep(4 * time.Second)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	started := time.Now()
	err := srv.Shutdown(ctx)
	took := time.Since(started)
	cancel()
	t.Logf("pg_ctl stop -m fast with %d rows committed during the outage (window 100) took %s", len(unacked), took.Round(10*time.Millisecond))
	// A correctness bound, not a speed claim: without the fix the stop
	// never finishes while the relay is connected.
	if err != nil || took > 15*time.Second {
		p.kill() // the walsender's client gone, PostgreSQL can finish stopping
		t.Fatalf("PostgreSQL did not stop within 15s while the window was full and the broker down (took %s): %v", took.Round(10*time.Millisecond), err)
	}
	for _, want := range []string{"the in-flight window is full", "closing the replication connection without confirming"} {
		if !strings.Contains(p.out.String(), want) {
			t.Errorf("relay did not log %q", want)
		}
	}
	select {
	case <-p.done:
		t.Fatalf("relay exited (%v) while PostgreSQL was down; it must reconnect", p.err)
	default:
	}

	if err := srv.StartAgain(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.db = connectT(t, e.dbURL)
	var confirmedPast bool
	if err := e.db.QueryRow(t.Context(), "SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxrelay'", outageStart).Scan(&confirmedPast); err != nil {
		t.Fatal(err)
	}
	if confirmedPast {
		t.Errorf("slot confirmed at %s, past %s where the unacknowledged rows begin", e.slotLSN(), outageStart)
	}
	cluster = newCluster()
	t.Cleanup(cluster.Close)
	t.Log("PostgreSQL and broker started again")
	ids = append(ids, e.insertRetry("outbox", "order", "9", 20)...)
	c := e.consume("outbox.order")
	recs := c.waitIDs(ids, 180*time.Second)
	p.stop()
	t.Logf("rows committed %d, delivered %d, lost 0, duplicates %d (records %d)", len(ids), len(ids), duplicates(recs), len(recs))
}
