package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// insertLoop inserts txns transactions of rowsPerTx rows across aggregates
// in the background and returns the ids once done.
func (e *env) insertLoop(txns, rowsPerTx int, pause time.Duration) func() []string {
	var mu sync.Mutex
	var ids []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < txns; i++ {
			got := e.insertRetry("outbox", "order", fmt.Sprint(i%13), rowsPerTx)
			mu.Lock()
			ids = append(ids, got...)
			mu.Unlock()
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	}()
	return func() []string {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return ids
	}
}

// insertRetry is insert on a fresh connection, retried while PostgreSQL restarts.
func (e *env) insertRetry(table, aggType, aggID string, n int) []string {
	for attempt := 0; ; attempt++ {
		ids, err := insertOnce(e.t.Context(), e.dbURL, table, aggType, aggID, n)
		if err == nil {
			return ids
		}
		if attempt > 100 || e.t.Context().Err() != nil {
			e.t.Errorf("insert: %v", err)
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKillNineRepeatedly crashes the relay at random moments while rows are
// written, and checks that every row arrives at least once.
func TestKillNineRepeatedly(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	wait := e.insertLoop(500, 100, 5*time.Millisecond)
	kills := 0
	for kills < 10 {
		p := e.start()
		time.Sleep(time.Duration(300+rand.IntN(900)) * time.Millisecond)
		p.kill()
		kills++
	}
	ids := wait()
	p := e.start()
	recs := c.waitIDs(ids, 120*time.Second)
	p.stop()
	t.Logf("kill -9: rows %d, kills %d, lost 0, duplicates %d (records %d)", len(ids), kills, duplicates(recs), len(recs))
	if len(ids) != 50000 {
		t.Fatalf("inserted %d rows, want 50000", len(ids))
	}
}

// restartableKafka closes the test's broker and returns a function that
// starts one on a fixed port and data directory: each call is the same
// broker again, with what it stored, as after a restart.
func (e *env) restartableKafka() func() *kfake.Cluster {
	e.t.Helper()
	e.kafka.Close()
	port := freePort(e.t)
	dir := e.t.TempDir()
	return func() *kfake.Cluster {
		cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SyncWrites(),
			kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
		if err != nil {
			e.t.Fatal(err)
		}
		return cl
	}
}

// TestKafkaOutage stops the broker in the middle of a stream and starts it
// again on the same port with the same data directory.
func TestKafkaOutage(t *testing.T) {
	e := newEnv(t)
	newCluster := e.restartableKafka()
	cluster := newCluster()
	e.brokers = cluster.ListenAddrs()[0]
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	wait := e.insertLoop(100, 50, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	cluster.Close()
	t.Log("broker stopped")
	time.Sleep(3 * time.Second)
	cluster = newCluster()
	t.Cleanup(cluster.Close)
	t.Log("broker started again")
	ids := wait()
	c := e.consume("outbox.order")
	recs := c.waitIDs(ids, 90*time.Second)
	p.stop()
	t.Logf("kafka outage: rows %d, lost 0, duplicates %d", len(ids), duplicates(recs))
}

// TestPostgresRestartMidStream restarts PostgreSQL while rows are written:
// every row arrives once, in its aggregate's order.
func TestPostgresRestartMidStream(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	wait := e.insertLoop(100, 50, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Log("PostgreSQL restarted")
	ids := wait()
	c.waitIDs(ids, 90*time.Second)
	p.waitLog("reconnecting", time.Second)
	time.Sleep(500 * time.Millisecond) // a copy would come right behind the first
	recs := c.records()
	p.stop()
	// The relay keeps running: it knows every transaction it handed over,
	// and those the slot delivers again because their position was not yet
	// confirmed are not handed over again (before: 900 of 5,000 twice).
	checkOnce(t, "PostgreSQL restart", ids, recs)
	t.Logf("postgres restart: rows %d, lost 0, duplicates %d", len(ids), duplicates(recs))
}

// TestPoisonMessageDeadLettered: a message the broker will never take goes
// to outboxrelay.dead_letters after the configured attempts, the rows after
// it still arrive, and `dlq replay` publishes it once the cause is fixed.
func TestPoisonMessageDeadLettered(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order", "outbox.replayed")
	p := e.start("OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2")
	p.waitLog(`"streaming"`, 30*time.Second)

	before := e.insert("outbox", "order", "1", 5)
	var poison, badHeaders string
	e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('no good', '7', 'order.created', '{"n": 1}') RETURNING id::text`).Scan(&poison)
	e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', '8', 'order.created', '{"n": 2}', '[1, 2]') RETURNING id::text`).Scan(&badHeaders)
	after := e.insert("outbox", "order", "1", 5)
	c.waitIDs(append(before, after...), 60*time.Second)

	// The dead letters are committed before the relay confirms past them.
	var letters []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
		if code != 0 {
			t.Fatalf("dlq list exit %d: %s", code, out)
		}
		letters = nil
		if err := json.Unmarshal([]byte(out), &letters); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		if len(letters) == 2 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(letters) != 2 {
		t.Fatalf("dead letters: %v", letters)
	}
	byID := map[string]map[string]any{}
	for _, l := range letters {
		byID[fmt.Sprint(l["message_id"])] = l
	}
	pl := byID[poison]
	if pl == nil || pl["attempts"].(float64) != 2 || !strings.Contains(fmt.Sprint(pl["error"]), "topic") ||
		!strings.Contains(fmt.Sprint(pl["envelope"]), poison) {
		t.Fatalf("poison dead letter = %v", pl)
	}
	if bl := byID[badHeaders]; bl == nil || !strings.Contains(fmt.Sprint(bl["error"]), "headers must be a JSON object") {
		t.Fatalf("bad-headers dead letter = %v", bl)
	}
	p.stop()

	// Fix the cause (route to a valid topic) and replay.
	cfg := e.config()
	out, code := e.cliEnv([]string{"OUTBOXRELAY_SINK_KAFKA_TOPIC=outbox.replayed"}, "dlq", "replay", "--config", cfg, "--id", fmt.Sprint(pl["id"]))
	if code != 0 || !strings.Contains(out, "replayed 1") {
		t.Fatalf("dlq replay exit %d: %s", code, out)
	}
	recs := c.waitIDs([]string{poison}, 30*time.Second)
	for _, r := range recs {
		if r.Headers["message_id"] == poison && r.Topic != "outbox.replayed" {
			t.Fatalf("replayed to %s", r.Topic)
		}
	}
	out, _ = e.cli("dlq", "list", "--database-url", e.dbURL)
	if strings.Contains(out, poison) {
		t.Fatalf("replayed letter still pending:\n%s", out)
	}
	out, code = e.cli("dlq", "purge", "--database-url", e.dbURL, "--before", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "purged 2") {
		t.Fatalf("dlq purge exit %d: %s", code, out)
	}
}

// TestStandbyTakeover runs two relays on one slot; when the active one is
// killed the standby takes over within seconds and nothing is lost.
func TestStandbyTakeover(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	a := e.start()
	a.waitLog(`"streaming"`, 30*time.Second)
	b := e.start()
	b.waitLog("waiting as standby", 30*time.Second)
	// A standby is not ready, but counts as a healthy standby for orchestrators.
	if code, body := get(t, "http://"+b.httpAddr()+"/readyz"); code != 503 {
		t.Errorf("standby /readyz = %d %q, want 503", code, body)
	}
	if code, body := get(t, "http://"+b.httpAddr()+"/readyz?standby=ok"); code != 200 {
		t.Errorf("standby /readyz?standby=ok = %d %q, want 200", code, body)
	}
	if code, _ := get(t, "http://"+a.httpAddr()+"/readyz"); code != 200 {
		t.Errorf("active /readyz = %d, want 200", code)
	}
	wait := e.insertLoop(100, 50, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	a.kill()
	killed := time.Now()
	b.waitLog(`"streaming"`, 30*time.Second)
	took := time.Since(killed)
	ids := wait()
	recs := c.waitIDs(ids, 60*time.Second)
	b.stop()
	t.Logf("standby took over after %s; rows %d, lost 0, duplicates %d", took.Round(10*time.Millisecond), len(ids), duplicates(recs))
	if took > 10*time.Second {
		t.Errorf("takeover took %s, want a few seconds", took)
	}
}

// TestIdleSlotDoesNotPinWAL: while only a non-outbox table is written, the
// slot's confirmed_flush_lsn still advances.
func TestIdleSlotDoesNotPinWAL(t *testing.T) {
	e := newEnv(t)
	e.exec("CREATE TABLE busy (id bigserial primary key, pad text)")
	p := e.start("OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=300ms")
	p.waitLog(`"streaming"`, 30*time.Second)
	time.Sleep(time.Second)
	start := e.slotLSN()
	for i := 0; i < 20; i++ {
		e.exec("INSERT INTO busy (pad) SELECT repeat('x', 500) FROM generate_series(1, 500)")
		time.Sleep(100 * time.Millisecond)
	}
	var current string
	if err := e.db.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&current); err != nil {
		t.Fatalf("read the current WAL position: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		// A missing slot or a NULL confirmed_flush_lsn is an error here, not
		// a slot that caught up.
		var behind bool
		err := e.db.QueryRow(t.Context(), "SELECT $1::pg_lsn > confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxrelay'", current).Scan(&behind)
		if err != nil {
			t.Fatalf("compare the slot's confirmed_flush_lsn with %s: %v", current, err)
		}
		if !behind {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("confirmed_flush_lsn stuck at %s (started %s) while WAL moved to %s", e.slotLSN(), start, current)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("slot advanced from %s past %s with no outbox writes", start, current)
	p.stop()
}

// TestReplacedSlotIsRefused: a slot dropped and re-created behind the
// relay's back is reported, not silently streamed from its new position.
func TestReplacedSlotIsRefused(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 10)
	c.waitIDs(ids, 30*time.Second)
	time.Sleep(1500 * time.Millisecond) // let the checkpoint be recorded
	p.stop()
	e.exec("SELECT pg_drop_replication_slot('outboxrelay')")
	e.insert("outbox", "order", "1", 10) // written while no slot exists: would be lost
	e.exec("SELECT pg_create_logical_replication_slot('outboxrelay', 'pgoutput')")
	out, code := e.cli("run", "--config", e.config())
	if code != 2 || !strings.Contains(out, "re-created") {
		t.Fatalf("exit %d, want 2 naming the replaced slot:\n%s", code, out)
	}
}

// TestDroppedSlotIsNamed: a slot dropped while the relay was stopped, on a
// server that was never promoted, is reported as dropped, not blamed on a
// failover.
func TestDroppedSlotIsNamed(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 10)
	c.waitIDs(ids, 30*time.Second)
	time.Sleep(1500 * time.Millisecond) // let the checkpoint be recorded
	p.stop()
	e.exec("SELECT pg_drop_replication_slot('outboxrelay')")
	out, code := e.cli("run", "--config", e.config())
	if code != 2 || !strings.Contains(out, "it was dropped") || strings.Contains(out, "failover") || !strings.Contains(out, "outboxrelay recover") {
		t.Fatalf("exit %d, want 2 saying the slot was dropped, without blaming a failover, and naming recover:\n%s", code, out)
	}
	t.Logf("relay after the slot was dropped: %s", tail(strings.TrimSpace(out), 1))
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestLostSlotExitsTwo: when PostgreSQL removed WAL the slot still needed
// (max_slot_wal_keep_size), the relay refuses to start with one clear line.
func TestLostSlotExitsTwo(t *testing.T) {
	srv, _ := startServer(t, map[string]string{"max_slot_wal_keep_size": "1MB", "max_wal_size": "64MB", "min_wal_size": "32MB"})
	e := &env{t: t, dbURL: srv.URL("outbox_test"), brokers: "127.0.0.1:1"}
	if out, code := e.cli("migrate", "--database-url", e.dbURL); code != 0 {
		t.Fatalf("migrate: %s", out)
	}
	conn := connectT(t, e.dbURL)
	deadline := time.Now().Add(60 * time.Second)
	var status string
	for status != "lost" {
		for i := 0; i < 3; i++ {
			if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('o', '1', 'e', '{}')"); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(t.Context(), "SELECT pg_switch_wal()"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := conn.Exec(t.Context(), "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(t.Context(), "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = 'outboxrelay'").Scan(&status); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot never lost its WAL (wal_status %q)", status)
		}
	}
	out, code := e.cli("run", "--config", e.config())
	if code != 2 || !strings.Contains(out, "wal_status=lost") || !strings.Contains(out, "max_slot_wal_keep_size") {
		t.Fatalf("exit %d, want 2 naming the lost slot:\n%s", code, out)
	}
}
