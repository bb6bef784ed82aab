package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// Adversarial tests of the spill store (issue 42 item 1): a sink that
// falls behind has its messages stored in outboxrelay.spilled so that the
// others go on. Each test fails while the defect it names is present.

// spillAttackConfig is a relay on slot with the sinks (name: section, in
// order) and routes given, and a small in-flight bound.
func spillAttackConfig(e *env, slot string, maxInflight int, sinks [][2]string, routes string) string {
	var b strings.Builder
	for _, s := range sinks {
		fmt.Fprintf(&b, "\n  %s:%s", s[0], s[1])
	}
	return fmt.Sprintf(`postgres:
  url: %s
  slot: %s
  status_interval: 200ms
relay:
  max_inflight: %d
  drain_timeout: 3s
sinks:%s
routes:%s
http:
  listen: 127.0.0.1:0
`, e.dbURL, slot, maxInflight, b.String(), routes)
}

const spillAttackRoutes = `
  - name: orders-down
    when: 'aggregate_type == "order"'
    sink: down
    continue: true
  - name: all-healthy
    sink: healthy`

// TestSpillAttackInvalidRowsDisableSpill: rows dead-lettered as invalid
// when the stream builds them never entered a sink's queue, yet their
// settling counts them out of it (publisher.held). After enough of them
// the first sink counts far fewer messages held than it holds, never
// reaches its share, never spills, and a later outage of that sink fills
// the shared in-flight bound and stops the healthy sink: the defect of
// issue 42 item 1 comes back.
func TestSpillAttackInvalidRowsDisableSpill(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_invalid")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	p := e.startConfig(spillAttackConfig(e, "spill_invalid", 30,
		[][2]string{{"down", down.section}, {"healthy", healthy.section}}, spillAttackRoutes))
	p.waitLog(`"streaming"`, 30*time.Second)

	// 100 orders without an event type: invalid, dead-lettered at once.
	const invalid = 100
	if _, err := e.db.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'bad' || g, '', '{}' FROM generate_series(1, $1) g`, invalid); err != nil {
		t.Fatal(err)
	}
	var dead int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && dead < invalid; time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.dead_letters`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
	}
	if dead < invalid {
		t.Fatalf("%d of %d invalid rows dead-lettered", dead, invalid)
	}

	// The down sink hangs; 150 valid orders go to both sinks.
	down.hang(true)
	defer down.hang(false)
	orders := map[string][]string{}
	var ids []string
	for i := 0; i < 150; i++ {
		agg := fmt.Sprint("o", i%5)
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		orders[agg] = append(orders[agg], id)
		ids = append(ids, id)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && healthy.ledger.distinct() < len(ids); {
		time.Sleep(100 * time.Millisecond)
	}
	var spilled int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled`).Scan(&spilled); err != nil {
		t.Fatal(err)
	}
	got := healthy.ledger.distinct()
	t.Logf("%d invalid rows dead-lettered, then %d orders with the down sink hanging: healthy received %d within 20 s, %d stored for the down sink",
		dead, len(ids), got, spilled)
	if got < len(ids) {
		t.Errorf("the healthy sink received %d of %d orders within 20 s while the other hung (%d stored): "+
			"after %d invalid rows the down sink no longer spills", got, len(ids), spilled, invalid)
	}
	down.hang(false)
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline) && down.ledger.distinct() < len(ids); {
		time.Sleep(100 * time.Millisecond)
	}
	p.stop()
	checkCommitOrder(t, orders, down.ledger.got)
	checkCommitOrder(t, orders, healthy.ledger.got)
}

// spillStored runs a relay on slot whose sink "down" hangs while 200
// orders are committed, until the healthy sink has them all and the spill
// store holds at least 50 of the down sink's, then stops it (SIGTERM) with
// them stored. It returns the orders by aggregate and in commit order.
func spillStored(t *testing.T, e *env, slot string, down, healthy outageSink) (map[string][]string, []string, int) {
	t.Helper()
	ctx := t.Context()
	down.hang(true)
	p := e.startConfig(spillAttackConfig(e, slot, 90,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
	p.waitLog(`"streaming"`, 30*time.Second)
	orders := map[string][]string{}
	var ids []string
	for i := 0; i < 200; i++ {
		agg := fmt.Sprint("o", i%6)
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		orders[agg] = append(orders[agg], id)
		ids = append(ids, id)
	}
	var stored int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if healthy.ledger.distinct() == len(ids) && stored >= 50 {
			break
		}
	}
	if stored < 50 || healthy.ledger.distinct() != len(ids) {
		t.Fatalf("setup: %d stored, healthy has %d of %d", stored, healthy.ledger.distinct(), len(ids))
	}
	// The sink still hangs, but a copy of what it holds is stored too, so
	// the slot passes every order; the relay stops with them all stored.
	var lastLSN string
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lastLSN); err != nil {
		t.Fatal(err)
	}
	for past, deadline := false, time.Now().Add(60*time.Second); !past; time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`, lastLSN, slot).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if !past && time.Now().After(deadline) {
			t.Fatalf("the slot did not pass %s once the sink answered again", lastLSN)
		}
	}
	p.stop()
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored < 50 {
		t.Fatalf("setup: %d stored when the relay stopped, want at least 50", stored)
	}
	return orders, ids, stored
}

// TestSpillAttackStoredStrandedByConfig: messages stored for a sink that
// was behind are past the slot: outboxrelay.spilled is their only copy. A
// restart whose configuration no longer spills (relay.behind: hold, or
// the sinks reduced to the one that is behind) must deliver them or refuse
// to start naming them, as it does when the sink is gone. It does
// neither: the start check runs only when the relay spills, the stored
// messages are never read, and the sink never gets them.
func TestSpillAttackStoredStrandedByConfig(t *testing.T) {
	cases := []struct {
		name  string
		slot  string
		sinks func(down, healthy outageSink) [][2]string
		extra string
	}{
		{"behind-hold", "spill_hold", func(d, h outageSink) [][2]string { return [][2]string{{"healthy", h.section}, {"down", d.section}} },
			"\n  behind: hold"},
		{"one-sink", "spill_one", func(d, h outageSink) [][2]string { return [][2]string{{"down", d.section}} }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvWith(t, serverFor(t), "", "--slot", c.slot)
			ctx := t.Context()
			down, healthy := webhookOutageSink(t), webhookOutageSink(t)
			orders, ids, stored := spillStored(t, e, c.slot, down, healthy)

			down.hang(false)
			routes := spillAttackRoutes
			if c.name == "one-sink" {
				routes = "\n  - name: orders-down\n    when: 'aggregate_type == \"order\"'\n    sink: down"
			}
			cfg := strings.Replace(spillAttackConfig(e, c.slot, 90, c.sinks(down, healthy), routes), "  drain_timeout: 3s", "  drain_timeout: 3s"+c.extra, 1)
			p := e.startConfig(cfg)
			refused := false
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && down.ledger.distinct() < len(ids); time.Sleep(100 * time.Millisecond) {
				select {
				case <-p.done:
					refused = true
				default:
				}
				if refused {
					break
				}
			}
			var left int
			if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			out := p.out.String()
			if !refused {
				p.stop()
			}
			got := down.ledger.distinct()
			t.Logf("%s: %d orders, %d stored when the relay stopped; restarted: refused %v, the down sink got %d, %d still stored", c.name, len(ids), stored, refused, got, left)
			switch {
			case refused:
				if !strings.Contains(out, "outboxrelay.spilled") {
					t.Errorf("the start refused without naming outboxrelay.spilled:\n%s", tail(out, 20))
				}
				if left != stored {
					t.Errorf("a refused start changed outboxrelay.spilled: %d stored before, %d after", stored, left)
				}
			case got < len(ids):
				t.Errorf("restarted with %s: the down sink got %d of %d orders within 30 s and %d stay in outboxrelay.spilled, past the slot: lost without a word",
					c.name, got, len(ids), left)
			default:
				checkCommitOrder(t, orders, down.ledger.got)
			}
		})
	}
}

// TestSpillAttackKillWhileBehind: the relay is killed (SIGKILL) twice
// under a steady load: once while the down sink hangs with messages
// stored, and once while it reads them back. After the restarts both
// sinks have every order (per-aggregate order of first arrivals kept),
// the store ends empty, and the slot, sampled every 200 ms, is never
// confirmed past an order's commit end while the down sink neither had it
// nor the store held it.
func TestSpillAttackKillWhileBehind(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_kill")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	cfg := spillAttackConfig(e, "spill_kill", 90, [][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes)
	p := e.startConfig(cfg)
	p.waitLog(`"streaming"`, 30*time.Second)

	type sample struct {
		at        time.Time
		confirmed pglogrepl.LSN
		spilled   map[string]bool
	}
	var mu sync.Mutex
	var samples []sample
	orders := map[string][]string{}
	endOf := map[string]pglogrepl.LSN{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the sampler
		defer wg.Done()
		conn, err := pgx.Connect(ctx, e.dbURL)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			var lsn string
			var ids []string
			if err := conn.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'spill_kill'), '0/0')::text,
				coalesce((SELECT array_agg(message_id) FROM outboxrelay.spilled WHERE sink = 'down'), '{}')`).Scan(&lsn, &ids); err != nil {
				continue
			}
			s := sample{at: time.Now(), spilled: map[string]bool{}}
			s.confirmed, _ = pglogrepl.ParseLSN(lsn)
			for _, id := range ids {
				s.spilled[id] = true
			}
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
		}
	}()
	go func() { // the producer: an order every 10 ms
		defer wg.Done()
		conn, err := pgx.Connect(ctx, e.dbURL)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			agg := fmt.Sprint("o", i%6)
			var id, end string
			if err := conn.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, agg).Scan(&id); err != nil {
				t.Error(err)
				return
			}
			if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
				t.Error(err)
				return
			}
			l, _ := pglogrepl.ParseLSN(end)
			mu.Lock()
			orders[agg] = append(orders[agg], id)
			endOf[id] = l
			mu.Unlock()
		}
	}()
	storedNow := func() int {
		var n int
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(time.Second)
	down.hang(true)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && storedNow() < 150; {
		time.Sleep(100 * time.Millisecond)
	}
	stored1 := storedNow()
	p.kill() // with messages stored, the sink hanging
	p = e.startConfig(cfg)
	p.waitLog(`"streaming"`, 30*time.Second)
	time.Sleep(3 * time.Second)
	// Back, slowly: the relay reads the stored messages back, and is
	// killed while it does.
	down.slow(40 * time.Millisecond)
	down.hang(false)
	time.Sleep(1500 * time.Millisecond)
	stored2 := storedNow()
	p.kill()
	p = e.startConfig(cfg)
	p.waitLog(`"streaming"`, 30*time.Second)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	down.slow(0)
	total := 0
	for _, ids := range orders {
		total += len(ids)
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) &&
		(down.ledger.distinct() < total || healthy.ledger.distinct() < total || storedNow() > 0); {
		time.Sleep(200 * time.Millisecond)
	}
	left := storedNow()
	if f := os.Getenv("ATTACK_DUMP"); f != "" && down.ledger.distinct() < total {
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		<-p.done
		_ = os.WriteFile(f, []byte(p.out.String()), 0o600)
	} else {
		p.stop()
	}

	lostDown, lostHealthy := 0, 0
	for id := range endOf {
		if _, ok := down.ledger.at(id); !ok {
			lostDown++
		}
		if _, ok := healthy.ledger.at(id); !ok {
			lostHealthy++
		}
	}
	violations := 0
	for _, s := range samples {
		for id, end := range endOf {
			if s.confirmed <= end || s.spilled[id] {
				continue
			}
			if at, ok := down.ledger.at(id); ok && !at.After(s.at) {
				continue
			}
			violations++
			if violations <= 3 {
				t.Errorf("at %s the slot was confirmed to %s, past order %s (commit end at most %s), which the down sink had not received and the store did not hold",
					s.at.Format("15:04:05.000"), s.confirmed, id, end)
			}
		}
	}
	t.Logf("%d orders; stored %d at the first kill, %d at the second; down: lost %d, duplicates %d; healthy: lost %d, duplicates %d; %d left stored; %d slot samples, %d violations",
		total, stored1, stored2, lostDown, down.ledger.dups, lostHealthy, healthy.ledger.dups, left, len(samples), violations)
	if lostDown != 0 || lostHealthy != 0 || left != 0 {
		t.Errorf("after two kills: lost %d (down) and %d (healthy), %d left in outboxrelay.spilled; want 0, 0, 0", lostDown, lostHealthy, left)
	}
	if stored1 < 100 || stored2 == 0 {
		t.Errorf("stored %d at the first kill and %d at the second: the kills must hit a sink behind and a read-back", stored1, stored2)
	}
	checkCommitOrder(t, orders, down.ledger.got)
	checkCommitOrder(t, orders, healthy.ledger.got)
}

// TestSpillAttackSlowStoreDeadlock: the spill store is slower than the
// stream for a moment (a lock on outboxrelay.spilled held 500 ms, as a
// vacuum or a busy database might) while a sink is behind. The stream
// waits for the spiller to take the sink's messages, which is documented;
// once the store answers again, every sink must go on. It deadlocks
// instead: the stream waits in divert holding the spiller's mutex, and the
// spiller's goroutine, the only reader of its queue, waits for that mutex
// in readBack at its next tick. The healthy sink then gets nothing more.
func TestSpillAttackSlowStoreDeadlock(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_slow")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	p := e.startConfig(spillAttackConfig(e, "spill_slow", 90,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
	p.waitLog(`"streaming"`, 30*time.Second)
	down.hang(true)
	defer down.hang(false)
	total := 0
	insert := func(n int) {
		if _, err := e.db.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', 'o' || (g % 5), 'order.created', '{}' FROM generate_series(1, $1) g`, n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	insert(100) // the down sink falls behind and spills
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && healthy.ledger.distinct() < total; {
		time.Sleep(100 * time.Millisecond)
	}
	locker, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	for round := 0; round < 8; round++ {
		tx, err := locker.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE outboxrelay.spilled IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		insert(200)
		time.Sleep(500 * time.Millisecond)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && healthy.ledger.distinct() < total; {
		time.Sleep(100 * time.Millisecond)
	}
	got := healthy.ledger.distinct()
	t.Logf("%d rows, 8 times a 500 ms lock on outboxrelay.spilled while the down sink hung: the healthy sink got %d", total, got)
	if got < total {
		if f := os.Getenv("ATTACK_DUMP"); f != "" {
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			<-p.done
			_ = os.WriteFile(f, []byte(p.out.String()), 0o600)
		}
		t.Fatalf("the healthy sink got %d of %d rows within 30 s after the spill store answered again: the relay is stuck", got, total)
	}
	p.stop()
}

// TestSpillAttackEmittedWhileBehind: table-less events (outboxrelay.emit,
// a transactional logical decoding message) interleaved with table rows
// in the same aggregates while the down sink hangs: they are stored and
// read back like rows, and the sink gets every one, in order.
func TestSpillAttackEmittedWhileBehind(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_emit")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	p := e.startConfig(spillAttackConfig(e, "spill_emit", 60,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
	p.waitLog(`"streaming"`, 30*time.Second)
	down.hang(true)
	orders := map[string][]string{}
	total := 0
	for i := 0; i < 300; i++ {
		agg := fmt.Sprint("o", i%4)
		var id string
		q := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`
		if i%2 == 1 {
			q = `SELECT outboxrelay.emit('order', $1, 'order.emitted', '{"n":1}')::text`
		}
		if err := e.db.QueryRow(ctx, q, agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		orders[agg] = append(orders[agg], id)
		total++
	}
	var stored int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if healthy.ledger.distinct() == total && stored > 100 {
			break
		}
	}
	down.hang(false)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && down.ledger.distinct() < total; {
		time.Sleep(100 * time.Millisecond)
	}
	p.stop()
	t.Logf("%d events (half emitted without a table), %d stored while the down sink hung; down got %d (duplicates %d), healthy %d",
		total, stored, down.ledger.distinct(), down.ledger.dups, healthy.ledger.distinct())
	if stored <= 100 {
		t.Errorf("%d stored, want more than 100", stored)
	}
	checkCommitOrder(t, orders, down.ledger.got)
	checkCommitOrder(t, orders, healthy.ledger.got)
}

// TestSpillAttackSchemaWithoutSpilled: a schema from before
// outboxrelay.spilled (migrate not run after the upgrade) and a relay with
// several sinks: the start refuses with one error naming both fixes, and
// leaves the database as it found it (slot position, publications).
func TestSpillAttackSchemaWithoutSpilled(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_noschema")
	ctx := t.Context()
	if _, err := e.db.Exec(ctx, `DROP TABLE outboxrelay.spilled`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o1', 'order.created', '{}')`); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		var s string
		if err := e.db.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'spill_noschema'), '-') || ' ' ||
			(SELECT count(*) FROM pg_publication)::text || ' ' || (SELECT count(*) FROM pg_replication_slots WHERE database = current_database())::text`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := state()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	out, code := e.cliConfig(spillAttackConfig(e, "spill_noschema", 60,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
	after := state()
	t.Logf("exit %d; slot/publications/slots before %q after %q; delivered %d and %d", code, before, after, healthy.ledger.distinct(), down.ledger.distinct())
	if code != 2 || !strings.Contains(out, "outboxrelay migrate") || !strings.Contains(out, "relay.behind: hold") {
		t.Errorf("exit %d, want 2 with one error naming `outboxrelay migrate` and relay.behind: hold:\n%s", code, tail(out, 10))
	}
	if after != before {
		t.Errorf("the failed start changed the database: slot position, publications, slots %q before, %q after", before, after)
	}
	if healthy.ledger.distinct() != 0 || down.ledger.distinct() != 0 {
		t.Errorf("the refused start published %d and %d messages", healthy.ledger.distinct(), down.ledger.distinct())
	}
}

// TestSpillAttackFlapping: under a steady load (an order every 10 ms) the
// down sink hangs and comes back every 1.5 s for 15 s, then stays up. Both
// sinks get every order, in per-aggregate order, and the store ends
// empty. Run with the webhook and Kafka as the flapping sink.
func TestSpillAttackFlapping(t *testing.T) {
	for _, c := range []struct {
		name string
		down func(*testing.T) outageSink
	}{{"webhook", webhookOutageSink}, {"kafka", kafkaOutageSink}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			slot := "spill_flap_" + c.name
			e := newEnvWith(t, serverFor(t), "", "--slot", slot)
			ctx := t.Context()
			down, healthy := c.down(t), webhookOutageSink(t)
			p := e.startConfig(spillAttackConfig(e, slot, 90,
				[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
			p.waitLog(`"streaming"`, 30*time.Second)
			orders := map[string][]string{}
			total, maxStored, flips := 0, 0, 0
			start, lastFlip, hung := time.Now(), time.Now(), false
			for i := 0; time.Since(start) < 18*time.Second; i++ {
				if time.Since(start) < 15*time.Second && time.Since(lastFlip) >= 1500*time.Millisecond {
					hung = !hung
					down.hang(hung)
					lastFlip = time.Now()
					flips++
				}
				if hung && time.Since(start) >= 15*time.Second {
					hung = false
					down.hang(false)
				}
				agg := fmt.Sprint("o", i%6)
				var id string
				if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, agg).Scan(&id); err != nil {
					t.Fatal(err)
				}
				orders[agg] = append(orders[agg], id)
				total++
				if i%50 == 0 {
					var n int
					if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled`).Scan(&n); err != nil {
						t.Fatal(err)
					}
					maxStored = max(maxStored, n)
				}
				time.Sleep(10 * time.Millisecond)
			}
			down.hang(false)
			var left int
			for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled`).Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left == 0 && down.ledger.distinct() >= total && healthy.ledger.distinct() >= total {
					break
				}
			}
			t.Logf("%s flapping %d times: %d orders, up to %d stored, %d left; down got %d (duplicates %d), healthy %d (duplicates %d)",
				c.name, flips, total, maxStored, left, down.ledger.distinct(), down.ledger.dups, healthy.ledger.distinct(), healthy.ledger.dups)
			if left != 0 {
				t.Errorf("%d messages left in outboxrelay.spilled", left)
			}
			if down.ledger.dups != 0 || healthy.ledger.dups != 0 {
				t.Errorf("duplicates without a restart: down %d, healthy %d; want 0", down.ledger.dups, healthy.ledger.dups)
			}
			p.stop()
			checkCommitOrder(t, orders, down.ledger.got)
			checkCommitOrder(t, orders, healthy.ledger.got)
		})
	}
}

// poisonWebhookSink is webhookOutageSink's receiver, but it refuses (422)
// every message whose body holds "poison".
func poisonWebhookSink(t *testing.T) outageSink {
	l := newSinkLedger()
	var down atomic.Bool
	up := make(chan struct{})
	var upMu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		if down.Load() {
			upMu.Lock()
			wait := up
			upMu.Unlock()
			select {
			case <-wait:
			case <-req.Context().Done():
			}
			http.Error(w, "was down", http.StatusServiceUnavailable)
			return
		}
		if strings.Contains(string(body), "poison") {
			http.Error(w, "poison", http.StatusUnprocessableEntity)
			return
		}
		l.record(t, body)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return outageSink{
		kind: "webhook", ledger: l,
		section: fmt.Sprintf(`
    type: webhook
    webhook:
      url: "%s/hooks/{aggregate_type}"
      secret: %s
      timeout: 2s`, srv.URL, e2eWebhookSecret),
		hang: func(on bool) {
			upMu.Lock()
			defer upMu.Unlock()
			down.Store(on)
			if !on {
				close(up)
				up = make(chan struct{})
			}
		},
	}
}

// TestSpillAttackPoisonReadBack: a message the down sink refuses for good
// is among those stored while it hung. Read back, it is dead-lettered for
// that sink and parks its aggregate there (relay.dead_letter_order park,
// max_attempts 1): the aggregate's later orders wait in outboxrelay.parked,
// the other aggregates reach the sink, and the spill store ends empty.
func TestSpillAttackPoisonReadBack(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_poison")
	ctx := t.Context()
	down, healthy := poisonWebhookSink(t), webhookOutageSink(t)
	cfg := strings.Replace(spillAttackConfig(e, "spill_poison", 60,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes),
		"  drain_timeout: 3s", "  drain_timeout: 3s\n  max_attempts: 1\n  dead_letter_order: park", 1)
	p := e.startConfig(cfg)
	p.waitLog(`"streaming"`, 30*time.Second)
	down.hang(true)
	var poison string
	var poisonAfter []string // o1's orders after the poison
	others := map[string][]string{}
	total, othersN := 0, 0
	for i := 0; i < 240; i++ {
		agg := fmt.Sprint("o", i%4)
		payload := `{}`
		if i == 161 {
			payload = `{"poison":true}`
		}
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'order.created', $2::jsonb) RETURNING id::text`, agg, payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		total++
		switch {
		case i == 161:
			poison = id
		case agg == "o1" && poison != "":
			poisonAfter = append(poisonAfter, id)
		default:
			others[agg] = append(others[agg], id)
			othersN++
		}
	}
	var stored int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down' AND message_id = $1`, poison).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored == 1 && healthy.ledger.distinct() == total {
			break
		}
	}
	if stored != 1 {
		t.Fatalf("setup: the poison message is not stored")
	}
	down.hang(false)
	var dead, parked, left int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outboxrelay.dead_letters WHERE message_id = $1 AND sink = 'down'),
			(SELECT count(*) FROM outboxrelay.parked WHERE sink = 'down'), (SELECT count(*) FROM outboxrelay.spilled)`, poison).Scan(&dead, &parked, &left); err != nil {
			t.Fatal(err)
		}
		if dead == 1 && parked == len(poisonAfter) && left == 0 && down.ledger.distinct() >= othersN {
			break
		}
	}
	p.stop()
	leaked := 0
	for _, id := range poisonAfter {
		if _, ok := down.ledger.at(id); ok {
			leaked++
		}
	}
	t.Logf("%d orders, the poison one stored; read back: dead letters %d, parked %d of %d, %d of %d other orders delivered, %d of the parked aggregate's leaked past it, %d left stored",
		total, dead, parked, len(poisonAfter), down.ledger.distinct()-leaked, othersN, leaked, left)
	if dead != 1 || parked != len(poisonAfter) || left != 0 || leaked != 0 {
		t.Errorf("want the poison message dead-lettered for sink down (got %d), its aggregate's %d later orders parked (got %d, %d delivered past it), the store empty (got %d)",
			dead, len(poisonAfter), parked, leaked, left)
	}
	checkCommitOrder(t, others, down.ledger.got)
}

// TestSpillAttackLostConnectionWhileBehind: the replication connection is
// ended (pg_terminate_backend of the walsender) three times while the down
// sink hangs and its messages are stored, under a steady load. The relay
// reconnects within the same process; the slot then delivers again the
// transactions it had not confirmed. The healthy sink shows what the
// relay does with them; the down sink must not get more duplicates than
// it: the stored messages of the transactions delivered again must not be
// stored twice.
func TestSpillAttackLostConnectionWhileBehind(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_lostconn")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	p := e.startConfig(spillAttackConfig(e, "spill_lostconn", 90,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
	p.waitLog(`"streaming"`, 30*time.Second)
	down.hang(true)
	orders := map[string][]string{}
	total, kills := 0, 0
	start := time.Now()
	for i := 0; time.Since(start) < 8*time.Second; i++ {
		if i > 0 && i%200 == 0 && kills < 3 {
			if _, err := e.db.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'spill_lostconn' AND active_pid IS NOT NULL`); err != nil {
				t.Fatal(err)
			}
			kills++
		}
		agg := fmt.Sprint("o", i%6)
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		orders[agg] = append(orders[agg], id)
		total++
		time.Sleep(5 * time.Millisecond)
	}
	var storedRows, storedDistinct int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && healthy.ledger.distinct() < total; {
		time.Sleep(100 * time.Millisecond)
	}
	if err := e.db.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&storedRows, &storedDistinct); err != nil {
		t.Fatal(err)
	}
	down.hang(false)
	var left int
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 && down.ledger.distinct() >= total {
			break
		}
	}
	if f := os.Getenv("ATTACK_DUMP"); f != "" && down.ledger.distinct() < total {
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		<-p.done
		_ = os.WriteFile(f, []byte(p.out.String()), 0o600)
	} else {
		p.stop()
	}
	t.Logf("%d orders, %d walsenders ended; stored %d rows for %d distinct messages; down got %d (duplicates %d), healthy %d (duplicates %d); %d left stored",
		total, kills, storedRows, storedDistinct, down.ledger.distinct(), down.ledger.dups, healthy.ledger.distinct(), healthy.ledger.dups, left)
	if kills < 3 {
		t.Errorf("only %d walsenders ended", kills)
	}
	if storedRows != storedDistinct {
		t.Errorf("outboxrelay.spilled holds %d rows for %d distinct messages: a transaction the slot delivered again was stored twice", storedRows, storedDistinct)
	}
	if down.ledger.dups > healthy.ledger.dups {
		t.Errorf("the down sink got %d duplicates, the healthy one %d: the messages stored while it was behind were delivered again", down.ledger.dups, healthy.ledger.dups)
	}
	checkCommitOrder(t, orders, down.ledger.got)
	checkCommitOrder(t, orders, healthy.ledger.got)
}

// TestSpillAttackSlotAdvancesDuringOutage: docs/routing.md says that with
// relay.behind: spill the slot goes on while a sink is down, "so WAL
// retention does not grow". The down sink hangs for 12 s under a steady
// load; by its end the slot must be confirmed past the orders committed
// in its first seconds, which the healthy sink took and the store holds.
// It stays where the outage began: the sink's share of the bound, held
// unanswered (and retried) by the sink, is never stored, and pins the
// watermark for as long as the sink is down.
func TestSpillAttackSlotAdvancesDuringOutage(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, serverFor(t), "", "--slot", "spill_pin")
	ctx := t.Context()
	down, healthy := webhookOutageSink(t), webhookOutageSink(t)
	p := e.startConfig(spillAttackConfig(e, "spill_pin", 90,
		[][2]string{{"healthy", healthy.section}, {"down", down.section}}, spillAttackRoutes))
	p.waitLog(`"streaming"`, 30*time.Second)
	slotAt := func() pglogrepl.LSN {
		var s string
		if err := e.db.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'spill_pin'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, _ := pglogrepl.ParseLSN(s)
		return l
	}
	down.hang(true)
	defer down.hang(false)
	start := time.Now()
	var early pglogrepl.LSN // the end of a commit 2 s into the outage
	total := 0
	for i := 0; time.Since(start) < 12*time.Second; i++ {
		if _, err := e.db.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'order.created', '{}')`, fmt.Sprint("o", i%6)); err != nil {
			t.Fatal(err)
		}
		total++
		if early == 0 && time.Since(start) >= 2*time.Second {
			var s string
			if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
				t.Fatal(err)
			}
			early, _ = pglogrepl.ParseLSN(s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second)
	at := slotAt()
	var stored int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM outboxrelay.spilled WHERE sink = 'down'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	var retained string
	if err := e.db.QueryRow(ctx, `SELECT pg_size_pretty(pg_current_wal_lsn() - confirmed_flush_lsn) FROM pg_replication_slots WHERE slot_name = 'spill_pin'`).Scan(&retained); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d orders during a 12 s outage; healthy got %d, %d stored; the slot is at %s, a commit 2 s into the outage ended by %s; WAL held by the slot %s",
		total, healthy.ledger.distinct(), stored, at, early, retained)
	if at <= early {
		t.Errorf("after 12 s of the down sink hanging, the slot is confirmed only to %s, before a commit 2 s into the outage (%s) that the healthy sink took and the store holds: WAL retention grows with the outage",
			at, early)
	}
	down.hang(false)
	p.stop()
}
