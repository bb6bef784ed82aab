package integration

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestEnvelopeKeyAndHeaders checks one row end to end against the README's
// envelope and headers.
func TestEnvelopeKeyAndHeaders(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	var id string
	err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, traceparent, schema_version)
		VALUES ('order', '42', 'order.created', '{"order_id": 42, "total": "99.90"}', '{"tenant": "acme", "n": 7}',
		        '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 3) RETURNING id::text`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	recs := c.waitIDs([]string{id}, 30*time.Second)
	r := recs[0]
	if r.Topic != "outbox.order" || r.Key != "42" {
		t.Errorf("topic %q key %q, want outbox.order and 42", r.Topic, r.Key)
	}
	wantHeaders := map[string]string{
		"message_id": id, "event_type": "order.created", "content-type": "application/json",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme", "n": "7",
	}
	for k, v := range wantHeaders {
		if r.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, r.Headers[k], v)
		}
	}
	env := r.Env
	want := map[string]any{
		"envelope_version": 1.0, "message_id": id, "event_type": "order.created", "schema_version": 3.0,
		"aggregate_type": "order", "aggregate_id": "42", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("envelope %s = %v, want %v", k, env[k], v)
		}
	}
	if got := fmt.Sprint(env["payload"]); got != "map[order_id:42 total:99.90]" {
		t.Errorf("payload = %s; must be embedded JSON", got)
	}
	if got := fmt.Sprint(env["headers"]); got != "map[n:7 tenant:acme]" {
		t.Errorf("headers = %s", got)
	}
	src, _ := env["source"].(map[string]any)
	lsnRE := regexp.MustCompile(`^[0-9A-F]+/[0-9A-F]+$`)
	if src["table"] != "public.outbox" || !strings.HasPrefix(fmt.Sprint(src["database"]), "it_") ||
		!lsnRE.MatchString(fmt.Sprint(src["lsn"])) || !lsnRE.MatchString(fmt.Sprint(src["commit_lsn"])) {
		t.Errorf("source = %v", src)
	}
	if xid, ok := src["xid"].(float64); !ok || xid <= 0 {
		t.Errorf("source.xid = %v", src["xid"])
	}
	for _, k := range []string{"occurred_at"} {
		if _, err := time.Parse("2006-01-02T15:04:05.000000Z", fmt.Sprint(env[k])); err != nil {
			t.Errorf("%s = %v: %v", k, env[k], err)
		}
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z", fmt.Sprint(src["committed_at"])); err != nil {
		t.Errorf("committed_at = %v", src["committed_at"])
	}
	var keys []string
	dec := json.NewDecoder(strings.NewReader(string(r.Value)))
	dec.Token()
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		dec.Decode(&skip)
	}
	if got := strings.Join(keys, ","); got != "envelope_version,message_id,event_type,schema_version,aggregate_type,aggregate_id,occurred_at,trace_id,traceparent,headers,source,payload" {
		t.Errorf("envelope keys = %s", got)
	}
	p.stop()
}

// TestOnlyCommittedRowsArrive covers rollback, ROLLBACK TO SAVEPOINT (also in
// a transaction big enough to spill past logical_decoding_work_mem), the
// insert-then-delete pattern and invalid traceparents.
func TestOnlyCommittedRowsArrive(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order", "outbox.poison", "outbox.ghost")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ctx := t.Context()

	var want []string
	want = append(want, e.insert("outbox", "order", "1", 3)...)

	// Every statement below must succeed: one that failed would leave
	// nothing to roll back, and the test would pass without testing it.
	begin := func() pgx.Tx {
		t.Helper()
		tx, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		return tx
	}
	txExec := func(tx pgx.Tx, sql string, args ...any) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// A rolled-back transaction.
	tx := begin()
	txExec(tx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('ghost', '1', 'x', '{}')`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}

	// A big transaction with a rolled-back savepoint in the middle: it spills.
	tx = begin()
	q := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, 'big', 'order.created', jsonb_build_object('seq', g, 'pad', repeat('x', 200)) FROM generate_series(1, $2) g RETURNING id::text`
	collect := func(aggType string, n int) []string {
		t.Helper()
		rows, err := tx.Query(ctx, q, aggType, n)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("insert %d %s rows: %v", n, aggType, err)
		}
		if len(ids) != n {
			t.Fatalf("inserted %d %s rows, want %d", len(ids), aggType, n)
		}
		return ids
	}
	want = append(want, collect("order", 3000)...)
	txExec(tx, "SAVEPOINT s1")
	collect("ghost", 2000)
	txExec(tx, "ROLLBACK TO SAVEPOINT s1")
	want = append(want, collect("order", 3000)...)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Insert then delete in the same transaction: the table stays empty, the event is sent.
	var deletedID string
	tx = begin()
	if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, traceparent)
		VALUES ('order', '2', 'order.paid', '{"ok": true}', 'not-a-traceparent') RETURNING id::text`).Scan(&deletedID); err != nil {
		t.Fatalf("insert the row to delete: %v", err)
	}
	txExec(tx, "DELETE FROM outbox WHERE id = $1", deletedID)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want = append(want, deletedID)
	// Updates and deletes of outbox rows are not events.
	e.exec("UPDATE outbox SET event_type = 'changed' WHERE aggregate_id = '1'")
	e.exec("DELETE FROM outbox WHERE aggregate_id = '1'")
	last := e.insert("outbox", "order", "3", 1)
	want = append(want, last...)

	c.waitIDs(want, 60*time.Second)
	time.Sleep(500 * time.Millisecond) // a stray message would arrive by now
	recs := c.records()
	wantSet := map[string]bool{}
	for _, id := range want {
		wantSet[id] = true
	}
	for _, r := range recs {
		if !wantSet[r.Headers["message_id"]] {
			t.Fatalf("unexpected message %s on %s (event %s): only committed rows may arrive", r.Headers["message_id"], r.Topic, r.Env["event_type"])
		}
		if r.Headers["message_id"] == deletedID {
			tid := fmt.Sprint(r.Env["trace_id"])
			if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(tid) || !strings.Contains(fmt.Sprint(r.Env["traceparent"]), tid) {
				t.Errorf("invalid traceparent must get a generated trace: trace_id %q traceparent %v", tid, r.Env["traceparent"])
			}
		}
	}
	t.Logf("received %d records for %d rows (%d duplicates)", len(recs), len(want), duplicates(recs))
	p.stop()
}

// TestPerAggregateOrder: records of one aggregate arrive in commit order.
func TestPerAggregateOrder(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	var ids []string
	for i := 0; i < 200; i++ {
		for a := 0; a < 10; a++ {
			var id string
			err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', $1, 'order.step', jsonb_build_object('seq', $2::int)) RETURNING id::text`, fmt.Sprint(a), i).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
	}
	recs := c.waitIDs(ids, 60*time.Second)
	last := map[string]float64{}
	for _, r := range recs {
		seq := r.Env["payload"].(map[string]any)["seq"].(float64)
		if prev, ok := last[r.Key]; ok && seq <= prev {
			t.Fatalf("aggregate %s: seq %v after %v; order within an aggregate must be commit order", r.Key, seq, prev)
		}
		last[r.Key] = seq
	}
	p.stop()
}

// TestTwoOutboxTables: both configured tables are relayed.
func TestTwoOutboxTables(t *testing.T) {
	e := newEnv(t)
	e.exec("CREATE TABLE billing_outbox (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
	e.exec("ALTER TABLE billing_outbox ADD PRIMARY KEY (id)")
	c := e.consume("outbox.order", "outbox.invoice")
	p := e.start("OUTBOXRELAY_POSTGRES_TABLES=public.outbox,public.billing_outbox")
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 5)
	ids = append(ids, e.insert("billing_outbox", "invoice", "9", 5)...)
	recs := c.waitIDs(ids, 30*time.Second)
	tables := map[string]bool{}
	for _, r := range recs {
		tables[fmt.Sprint(r.Env["source"].(map[string]any)["table"])] = true
	}
	if !tables["public.outbox"] || !tables["public.billing_outbox"] {
		t.Fatalf("source tables seen: %v", tables)
	}
	p.stop()
}

// TestRestartLosesNothing stops the relay in the middle of a stream, once
// cleanly (SIGTERM) and once by crash (SIGKILL), and checks every row arrives.
func TestRestartLosesNothing(t *testing.T) {
	for _, mode := range []string{"sigterm", "sigkill"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			c := e.consume("outbox.order")
			p := e.start()
			p.waitLog(`"streaming"`, 30*time.Second)
			var ids []string
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; i < 100; i++ {
					ids = append(ids, e.insert("outbox", "order", fmt.Sprint(i%7), 100)...)
				}
			}()
			time.Sleep(300 * time.Millisecond)
			if mode == "sigterm" {
				p.stop()
			} else {
				p.kill()
			}
			<-done
			before := len(c.records())
			p2 := e.start()
			p2.waitLog(`"streaming"`, 30*time.Second)
			recs := c.waitIDs(ids, 90*time.Second)
			t.Logf("%s: %d rows, %d received before restart, %d records total, %d duplicates, lost 0",
				mode, len(ids), before, len(recs), duplicates(recs))
			// A clean stop confirms everything acknowledged: only the
			// transaction that was open at SIGTERM (100 rows) may repeat.
			if d := duplicates(recs); mode == "sigterm" && d >= 100 {
				t.Errorf("%d duplicates after a clean stop; the final position was not confirmed", d)
			}
			// Once every row is acknowledged the slot catches up with the end
			// of the stream, and a clean stop keeps it there.
			var current string
			e.db.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&current)
			lagBehind := func() int64 {
				var lag int64
				e.db.QueryRow(t.Context(), "SELECT pg_wal_lsn_diff($1::pg_lsn, confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = 'outboxrelay'", current).Scan(&lag)
				return lag
			}
			deadline := time.Now().Add(20 * time.Second)
			for lagBehind() > 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			p2.stop()
			if lag := lagBehind(); lag > 0 {
				t.Errorf("after catching up and a clean stop the slot is %d bytes behind %s (confirmed %s)", lag, current, e.slotLSN())
			}
		})
	}
}

// TestBadSetupExitsTwo: each setup problem is one clear line and exit code 2.
func TestBadSetupExitsTwo(t *testing.T) {
	e := newEnv(t)
	writeCfg := func(body string) string {
		path := t.TempDir() + "/c.yaml"
		if err := writeFile(path, body); err != nil {
			t.Fatal(err)
		}
		return path
	}
	base := fmt.Sprintf("postgres:\n  url: %s\n  slot: bad_%%s\n  publication: bad_%%s\n  tables: [%%s]\nsink:\n  type: kafka\n  kafka:\n    brokers: [%%s]\n", e.dbURL)
	e.exec("CREATE ROLE norepl LOGIN PASSWORD 'hunter2secret'")
	noReplURL := strings.Replace(e.dbURL, "postgres://postgres@", "postgres://norepl:hunter2secret@", 1)
	cases := []struct {
		name, cfg, want string
	}{
		{"invalid config", "postgres:\n  url: x\nsink:\n  type: pigeon\n", `sink.type "pigeon"`},
		{"unknown key", "postgres:\n  url: x\n  slto: y\n", "slto"},
		{"missing table", fmt.Sprintf(base, "t1", "t1", "public.nope", e.brokers), "public.nope does not exist"},
		{"broker unreachable", fmt.Sprintf(base, "t2", "t2", "public.outbox", "127.0.0.1:1"), "cannot reach Kafka"},
		{"no replication privilege", strings.Replace(fmt.Sprintf(base, "t3", "t3", "public.outbox", e.brokers), e.dbURL, noReplURL, 1), "ALTER ROLE norepl REPLICATION"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, code := e.cli("run", "--config", writeCfg(tc.cfg))
			if code != 2 {
				t.Fatalf("exit %d, want 2; output:\n%s", code, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("output does not name the problem (%q):\n%s", tc.want, out)
			}
			if strings.Contains(out, "hunter2secret") {
				t.Fatalf("password leaked:\n%s", out)
			}
			if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic") {
				t.Fatalf("stack trace in output:\n%s", out)
			}
		})
	}
}

// TestWalLevelNotLogical uses a second server with wal_level=replica.
func TestWalLevelNotLogical(t *testing.T) {
	srv, err := startServer(t, map[string]string{"wal_level": "replica"})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dbURL: srv.URL("outbox_test"), brokers: "127.0.0.1:1"}
	// migrate creates the tables, then fails on the slot (TestMigrateWalLevelReplica).
	out, code := e.cli("migrate", "--database-url", e.dbURL)
	if code != 2 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	out, code = e.cli("run", "--config", e.config())
	if code != 2 || !strings.Contains(out, "wal_level is replica; set wal_level=logical") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	if n := strings.Count(strings.TrimSpace(out), "\n"); n > 1 {
		t.Errorf("want one clear line, got %d lines:\n%s", n+1, out)
	}
}
