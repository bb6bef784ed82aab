package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The coverage tests: every insert into a configured outbox table arrives,
// or the relay exits non-zero with the error and status exits 1. Never
// "healthy" with rows missing.

// waitExit waits for the relay to exit and returns its exit code.
func (p *proc) waitExit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("relay still running after %s\n%s", timeout, tail(p.out.String(), 40))
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		p.t.Fatalf("relay: %v", p.err)
	}
	return 0
}

// disableCoverageTrigger disables the event trigger migrate installs, as a
// database without a superuser for migrate would lack it.
func (e *env) disableCoverageTrigger() {
	e.t.Helper()
	e.exec(`DO $$ BEGIN
		IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'outboxrelay_coverage') THEN
			ALTER EVENT TRIGGER outboxrelay_coverage DISABLE;
		END IF;
	END $$`)
}

// requireUnhealthy checks that status exits 1 and names the problem.
func (e *env) requireUnhealthy(want string) {
	e.t.Helper()
	_, code, out := e.statusJSON()
	if code != 1 || !strings.Contains(out, want) {
		e.t.Fatalf("status exited %d, want 1 naming %q:\n%s", code, want, out)
	}
	text, _ := e.cli("status", "--database-url", e.dbURL)
	e.t.Logf("status:\n%s", text)
}

// producer inserts a row into table every few milliseconds until stopped,
// retrying failed inserts (a table briefly renamed, locked), and keeps the
// ledger of committed ids.
type producer struct {
	mu    sync.Mutex
	ids   []string
	table string
	stop  chan struct{}
	done  chan struct{}
}

func (e *env) produce(table string) *producer {
	pr := &producer{table: table, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		conn, err := pgx.Connect(context.Background(), e.dbURL)
		if err != nil {
			e.t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		for i := 0; ; i++ {
			select {
			case <-pr.stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			pr.mu.Lock()
			table := pr.table
			pr.mu.Unlock()
			var id string
			err := conn.QueryRow(context.Background(), fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', $1, 'order.created', '{}') RETURNING id::text`, table), fmt.Sprint(i%7)).Scan(&id)
			if err != nil {
				continue // the table is being swapped: the insert rolled back
			}
			pr.mu.Lock()
			pr.ids = append(pr.ids, id)
			pr.mu.Unlock()
		}
	}()
	return pr
}

// follow makes the producer write into another table (it follows a rename).
func (pr *producer) follow(table string) {
	pr.mu.Lock()
	pr.table = table
	pr.mu.Unlock()
}

func (pr *producer) finish() []string {
	close(pr.stop)
	<-pr.done
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return append([]string(nil), pr.ids...)
}

// lost counts the ids that never arrived.
func lost(ids []string, recs []record) int {
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Headers["message_id"]] = true
	}
	n := 0
	for _, id := range ids {
		if !seen[id] {
			n++
		}
	}
	return n
}

const partitionedOutbox = `
CREATE TABLE public.outbox (
    id             uuid        NOT NULL DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    traceparent    text        NULL,
    schema_version int         NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE public.outbox_2000 PARTITION OF public.outbox FOR VALUES FROM ('2000-01-01') TO ('2020-01-01');
CREATE TABLE public.outbox_2020 PARTITION OF public.outbox FOR VALUES FROM ('2020-01-01') TO ('2060-01-01');`

// TestPartitionedOutbox: a range-partitioned outbox, with a partition
// created, one attached and one dropped while the relay runs. Every row
// arrives under the root's name.
func TestPartitionedOutbox(t *testing.T) {
	e := newEnvWith(t, pg, partitionedOutbox)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	insertAt := func(at string, n int) []string {
		rows, err := e.db.Query(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
			SELECT 'order', (g % 5)::text, 'order.created', jsonb_build_object('seq', g), $1::timestamptz FROM generate_series(1, $2) g RETURNING id::text`, at, n)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	var ids []string
	ids = append(ids, insertAt("2010-05-01", 50)...)
	ids = append(ids, insertAt("2030-05-01", 100)...)
	e.exec(`CREATE TABLE public.outbox_2060 PARTITION OF public.outbox FOR VALUES FROM ('2060-01-01') TO ('2080-01-01')`)
	ids = append(ids, insertAt("2070-05-01", 100)...)
	e.exec(`CREATE TABLE public.outbox_2080 (LIKE public.outbox INCLUDING DEFAULTS)`)
	e.exec(`ALTER TABLE public.outbox ATTACH PARTITION public.outbox_2080 FOR VALUES FROM ('2080-01-01') TO ('2100-01-01')`)
	ids = append(ids, insertAt("2090-05-01", 100)...)
	e.exec(`DROP TABLE public.outbox_2000`)
	ids = append(ids, insertAt("2040-05-01", 129)...)
	recs := c.waitIDs(ids, 60*time.Second)
	for _, r := range recs {
		if src, _ := r.Env["source"].(map[string]any); src["table"] != "public.outbox" {
			t.Fatalf("source.table = %v, want the root public.outbox", src["table"])
		}
	}
	if _, code, out := e.statusJSON(); code != 0 {
		t.Fatalf("status exited %d:\n%s", code, out)
	}
	p.stop()
	t.Logf("partitioned outbox: committed %d, delivered %d, lost 0, duplicates %d", len(ids), len(ids), duplicates(recs))
}

// TestTableSwapGuarded: the bloat fix `ALTER TABLE outbox RENAME TO
// outbox_old; CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL)` while
// producers write. The coverage trigger adds the new table to the
// publication in the same transaction: every row arrives, and a restart
// accepts the new table.
func TestTableSwapGuarded(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	pr := e.produce("outbox")
	time.Sleep(time.Second)
	e.exec(`BEGIN; ALTER TABLE outbox RENAME TO outbox_old; CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL); COMMIT`)
	time.Sleep(2 * time.Second)
	ids := pr.finish()
	recs := c.waitIDs(ids, 60*time.Second)
	if _, code, out := e.statusJSON(); code != 0 {
		t.Fatalf("status exited %d after a guarded swap:\n%s", code, out)
	}
	p.stop()
	more := e.insert("outbox", "order", "1", 10)
	p = e.start()
	c.waitIDs(append(ids, more...), 60*time.Second)
	p.stop()
	t.Logf("guarded table swap: committed %d, delivered %d, lost 0, duplicates %d", len(ids)+len(more), len(ids)+len(more), duplicates(recs))
}

// TestTableSwapUnguarded: the same swap with the event trigger disabled.
// The new table is not in the publication; the relay must stop with the
// coverage error, status must exit 1, and a restart must refuse.
func TestTableSwapUnguarded(t *testing.T) {
	e := newEnv(t)
	e.disableCoverageTrigger()
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	pr := e.produce("outbox")
	time.Sleep(time.Second)
	e.exec(`BEGIN; ALTER TABLE outbox RENAME TO outbox_old; CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL); COMMIT`)
	code := p.waitExit(30 * time.Second)
	ids := pr.finish()
	if code == 0 || !strings.Contains(p.out.String(), "coverage lost") || !strings.Contains(p.out.String(), "is not in publication") {
		t.Fatalf("relay exited %d, want non-zero with the coverage error:\n%s", code, tail(p.out.String(), 20))
	}
	e.requireUnhealthy("is not in publication")
	out, rc := e.cli("run", "--config", e.config())
	if rc != 2 || !strings.Contains(out, "is no longer in publication") {
		t.Fatalf("restart exited %d, want 2 refusing:\n%s", rc, out)
	}
	recs := c.records()
	t.Logf("unguarded table swap: committed %d, delivered %d, missing %d; relay exited %d, status exit 1, restart refused",
		len(ids), len(ids)-lost(ids, recs), lost(ids, recs), code)
}

// TestRenameFollowedByProducers: the outbox is renamed and its producers
// write into the new name. The relay stops at the first insert under the
// unknown name, before confirming it; after the operator points the
// configuration at the new name, every row arrives.
func TestRenameFollowedByProducers(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	pr := e.produce("outbox")
	time.Sleep(500 * time.Millisecond)
	e.exec(`ALTER TABLE outbox RENAME TO outbox_v2`)
	pr.follow("outbox_v2")
	time.Sleep(time.Second)
	code := p.waitExit(30 * time.Second)
	ids := pr.finish()
	if code == 0 || !strings.Contains(p.out.String(), "public.outbox_v2") || !strings.Contains(p.out.String(), "not in postgres.tables") {
		t.Fatalf("relay exited %d, want non-zero naming the renamed table:\n%s", code, tail(p.out.String(), 20))
	}
	e.requireUnhealthy("not in postgres.tables")
	cfg := strings.Replace(e.configText(), "postgres:\n", "postgres:\n  tables: [public.outbox_v2]\n", 1)
	out, rc := e.cliConfig(cfg, "--check-config")
	if rc != 0 {
		t.Fatalf("check-config: %s", out)
	}
	// Another table set needs the operator's decision.
	p = e.startConfig(cfg)
	if code := p.waitExit(30 * time.Second); code != 2 || !strings.Contains(p.out.String(), "--accept-config-change") {
		t.Fatalf("relay with the new table exited %d, want 2 asking for --accept-config-change:\n%s", code, tail(p.out.String(), 20))
	}
	p = e.startConfig(cfg, "--accept-config-change")
	recs := c.waitIDs(ids, 60*time.Second)
	p.stop()
	t.Logf("rename followed by producers: committed %d, delivered %d, lost 0, duplicates %d", len(ids), len(ids), duplicates(recs))
}

// TestPublicationDropTable: ALTER PUBLICATION ... DROP TABLE with the
// trigger is refused (nothing lost); without it, the relay stops with the
// coverage error and status exits 1.
func TestPublicationDropTable(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	pr := e.produce("outbox")
	time.Sleep(500 * time.Millisecond)
	if _, err := e.db.Exec(t.Context(), `ALTER PUBLICATION outboxrelay DROP TABLE outbox`); err == nil || !strings.Contains(err.Error(), "out of publication") {
		t.Fatalf("ALTER PUBLICATION DROP TABLE: %v, want it refused by the coverage trigger", err)
	}
	if _, err := e.db.Exec(t.Context(), `ALTER PUBLICATION outboxrelay SET (publish = 'update, delete')`); err == nil || !strings.Contains(err.Error(), "publish = insert") {
		t.Fatalf("ALTER PUBLICATION SET (publish): %v, want it refused", err)
	}
	time.Sleep(500 * time.Millisecond)
	ids := pr.finish()
	recs := c.waitIDs(ids, 60*time.Second)
	t.Logf("guarded DROP TABLE: refused; committed %d, delivered %d, lost 0, duplicates %d", len(ids), len(ids), duplicates(recs))

	e.disableCoverageTrigger()
	pr = e.produce("outbox")
	time.Sleep(300 * time.Millisecond)
	e.exec(`ALTER PUBLICATION outboxrelay DROP TABLE outbox`)
	time.Sleep(4 * time.Second)
	e.exec(`ALTER PUBLICATION outboxrelay ADD TABLE outbox`)
	code := p.waitExit(30 * time.Second)
	more := pr.finish()
	if code == 0 || !strings.Contains(p.out.String(), "coverage lost") {
		t.Fatalf("relay exited %d, want non-zero with the coverage error:\n%s", code, tail(p.out.String(), 20))
	}
	e.requireUnhealthy("coverage lost")
	out, rc := e.cli("run", "--config", e.config())
	if rc != 2 || !strings.Contains(out, "dropped from publication") {
		t.Fatalf("restart exited %d, want 2 refusing the re-added table:\n%s", rc, out)
	}
	recs = c.records()
	t.Logf("unguarded DROP TABLE and re-add after 4 s: committed %d, delivered %d, missing %d; relay exited %d, status exit 1, restart refused",
		len(more), len(more)-lost(more, recs), lost(more, recs), code)
}

// TestForeignPublicationWithoutInserts: a publication with the relay's
// name that publishes only updates and deletes. migrate repairs it and says
// so; a relay started on such a publication refuses.
func TestForeignPublicationWithoutInserts(t *testing.T) {
	e := newEnvWith(t, pg, `CREATE TABLE public.outbox (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}', traceparent text,
		schema_version int NOT NULL DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now());
		CREATE PUBLICATION outboxrelay FOR TABLE public.outbox WITH (publish = 'update, delete')`)
	var ins, root bool
	if err := e.db.QueryRow(t.Context(), `SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = 'outboxrelay'`).Scan(&ins, &root); err != nil {
		t.Fatal(err)
	}
	if !ins || !root {
		t.Fatalf("after migrate: pubinsert %v, pubviaroot %v; want both repaired", ins, root)
	}
	out, _ := e.cli("migrate", "--database-url", e.dbURL)
	t.Logf("migrate again: %s", out)

	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 387)
	c.waitIDs(ids, 30*time.Second)
	p.stop()

	// Broken behind the relay's back, with the trigger disabled.
	e.disableCoverageTrigger()
	e.exec(`ALTER PUBLICATION outboxrelay SET (publish = 'update, delete')`)
	out, rc := e.cli("run", "--config", e.config())
	if rc != 2 || !strings.Contains(out, "does not publish inserts") {
		t.Fatalf("run on a publication without inserts exited %d, want 2:\n%s", rc, out)
	}
	e.requireUnhealthy("does not publish inserts")
}

// TestMigrateRepairsForeignPublicationMessage: migrate names what it repaired.
func TestMigrateRepairsForeignPublicationMessage(t *testing.T) {
	e := newEnv(t)
	e.disableCoverageTrigger()
	e.exec(`ALTER PUBLICATION outboxrelay SET (publish = 'delete')`)
	out, code := e.cli("migrate", "--database-url", e.dbURL)
	if code != 0 || !strings.Contains(out, "did not publish inserts") {
		t.Fatalf("migrate exited %d, want 0 naming the repair:\n%s", code, out)
	}
	e.exec(`CREATE TABLE other (id int)`)
	e.exec(`ALTER PUBLICATION outboxrelay ADD TABLE other`)
	e.exec(`ALTER PUBLICATION outboxrelay SET (publish = 'delete')`)
	out, code = e.cli("migrate", "--database-url", e.dbURL)
	if code != 2 || !strings.Contains(out, "publication of its own") {
		t.Fatalf("migrate with another table exited %d, want 2 refusing:\n%s", code, out)
	}
}

// TestStandbyWithOtherConfigRefuses: a second relay on the same slot with
// other tables or another publication refuses to start.
func TestStandbyWithOtherConfigRefuses(t *testing.T) {
	e := newEnv(t)
	e.exec(`CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 100)
	c.waitIDs(ids, 30*time.Second)

	for _, tc := range []struct{ name, cfg, want string }{
		{"other tables", "postgres:\n  tables: [public.outbox2]\n", "not configured for public.outbox"},
		{"other publication", "postgres:\n  publication: other\n", "consumed through publication outboxrelay"},
	} {
		cfg := strings.Replace(e.configText(), "postgres:\n", tc.cfg, 1)
		out, rc := e.cliConfig(cfg)
		if rc != 2 || !strings.Contains(out, tc.want) {
			t.Fatalf("%s: standby exited %d, want 2 with %q:\n%s", tc.name, rc, tc.want, out)
		}
	}
	more := e.insert("outbox", "order", "1", 100)
	c.waitIDs(append(ids, more...), 30*time.Second)
	p.stop()
}

// TestCheckpointLockDuringMigrate: a rerun of migrate while an idle reader
// holds the checkpoint table takes no ACCESS EXCLUSIVE lock; a checkpoint
// write blocked by a lock holds the confirmation, so that a restart after a
// crash in that moment starts (the slot is not ahead of the record).
func TestCheckpointLockDuringMigrate(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	reader, err := pgx.Connect(t.Context(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(context.Background())
	tx, err := reader.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `SELECT * FROM outboxrelay.checkpoint`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan string, 1)
	go func() {
		out, code := e.cli("migrate", "--database-url", e.dbURL)
		migrated <- fmt.Sprintf("exit %d: %s", code, out)
	}()
	select {
	case out := <-migrated:
		if !strings.HasPrefix(out, "exit 0") {
			t.Fatalf("migrate: %s", out)
		}
	case <-time.After(20 * time.Second):
		_ = tx.Rollback(context.Background())
		t.Fatalf("migrate waited for a lock behind an idle reader of outboxrelay.checkpoint: %s", <-migrated)
	}
	ids := e.insert("outbox", "order", "1", 50)
	c.waitIDs(ids, 30*time.Second)
	_ = tx.Rollback(t.Context())

	// A lock that blocks every checkpoint write for longer than its timeout.
	locker, err := pgx.Connect(t.Context(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	ltx, err := locker.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ltx.Exec(t.Context(), `LOCK TABLE outboxrelay.checkpoint IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	more := e.insert("outbox", "order", "2", 200)
	c.waitIDs(more, 30*time.Second)
	// /status answers within its timeout while the table is locked.
	addr := p.httpAddr()
	statusStart := time.Now()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Get("http://" + addr + "/status")
	if err != nil {
		t.Fatalf("GET /status while outboxrelay.checkpoint is locked: %v", err)
	}
	resp.Body.Close()
	if took := time.Since(statusStart); took > 10*time.Second {
		t.Fatalf("GET /status took %s while outboxrelay.checkpoint was locked, want its 5 s timeout", took)
	}
	t.Logf("GET /status with the checkpoint table locked: %d after %s", resp.StatusCode, time.Since(statusStart).Round(time.Millisecond))
	time.Sleep(7 * time.Second) // past the 5 s checkpoint timeout
	p.kill()
	_ = ltx.Rollback(t.Context())

	p = e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	last := e.insert("outbox", "order", "3", 20)
	recs := c.waitIDs(append(append(ids, more...), last...), 30*time.Second)
	p.stop()
	if strings.Contains(p.out.String(), "dropped and re-created") {
		t.Fatalf("restart reported a re-created slot:\n%s", p.out.String())
	}
	t.Logf("checkpoint lock: committed %d, delivered all, duplicates %d", len(ids)+len(more)+len(last), duplicates(recs))
}

// TestLagCountsUndecodedTransaction: a 200k-row transaction against a
// stopped broker. lag_bytes must count the WAL the transaction holds, not
// the keepalive positions that ran ahead through it.
func TestLagCountsUndecodedTransaction(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	e.kafka.Close() // the broker is gone: nothing will be acknowledged
	var before, after string
	if err := e.db.QueryRow(t.Context(), `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	e.insert("outbox", "order", "1", 200000)
	if err := e.db.QueryRow(t.Context(), `SELECT pg_current_wal_lsn()::text`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	var written int64
	if err := e.db.QueryRow(t.Context(), `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, after, before).Scan(&written); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // keepalives and status updates come and go
	st, _, out := e.statusJSON()
	if st.LagBytes < written*9/10 {
		t.Fatalf("lag_bytes = %d while %d bytes of WAL of an unpublished transaction are retained:\n%s", st.LagBytes, written, out)
	}
	if _, code, out := e.statusJSON("--max-lag-bytes", fmt.Sprint(written/2)); code != 1 {
		t.Fatalf("status --max-lag-bytes %d exited %d, want 1:\n%s", written/2, code, out)
	}
	var view int64
	if err := e.db.QueryRow(t.Context(), `SELECT lag_bytes FROM outboxrelay.status WHERE slot = 'outboxrelay'`).Scan(&view); err != nil {
		t.Fatal(err)
	}
	if view < written*9/10 {
		t.Fatalf("outboxrelay.status lag_bytes = %d, want >= %d", view, written*9/10)
	}
	t.Logf("200k-row transaction, broker stopped: WAL written %d bytes, lag_bytes %d (view %d)", written, st.LagBytes, view)
	p.kill()
}

// TestMigratePartitioned: `migrate --partitioned` creates a range-partitioned
// outbox with daily partitions ahead; rows arrive under the root's name;
// `maintain` drops daily partitions past postgres.retention and leaves the
// others, without DELETE.
func TestMigratePartitioned(t *testing.T) {
	e := newEnvWith(t, pg, "", "--partitioned")
	var parts int
	if err := e.db.QueryRow(t.Context(), `SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.outbox'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts != 1+1+7 { // default, today, 7 days ahead
		t.Fatalf("migrate --partitioned made %d partitions, want 9", parts)
	}
	e.exec(`CREATE TABLE public.outbox_p20000101 PARTITION OF public.outbox FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')`)
	e.exec(`CREATE TABLE public.outbox_keep PARTITION OF public.outbox FOR VALUES FROM ('2001-01-01') TO ('2001-01-02')`)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 100)
	var old []string
	rows, err := e.db.Query(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', '2', 'order.created', '{}', '2000-01-01T12:00:00Z' FROM generate_series(1, 20) RETURNING id::text`)
	if err != nil {
		t.Fatal(err)
	}
	if old, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	recs := c.waitIDs(append(ids, old...), 30*time.Second)
	for _, r := range recs {
		if src, _ := r.Env["source"].(map[string]any); src["table"] != "public.outbox" {
			t.Fatalf("source.table = %v, want public.outbox", src["table"])
		}
	}
	p.stop()
	cfg := strings.Replace(e.configText(), "postgres:\n", "postgres:\n  retention: 720h\n", 1)
	out, code := e.cli("maintain", "--config", e.writeConfig(cfg))
	if code != 0 || !strings.Contains(out, "dropped partition public.outbox_p20000101") {
		t.Fatalf("maintain exited %d:\n%s", code, out)
	}
	for name, want := range map[string]bool{"public.outbox_p20000101": false, "public.outbox_keep": true, "public.outbox_default": true} {
		var exists bool
		if err := e.db.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists != want {
			t.Fatalf("%s exists = %v after maintain, want %v", name, exists, want)
		}
	}
	t.Logf("migrate --partitioned: %d partitions made; %d rows delivered; maintain: %s", parts, len(recs), strings.TrimSpace(out))
}

// TestCoverageTriggerIgnoresUnrelatedDDL: with coverage already broken
// behind the trigger's back, DDL on other tables still works; DDL on the
// outbox table is refused until coverage is fixed.
func TestCoverageTriggerIgnoresUnrelatedDDL(t *testing.T) {
	e := newEnv(t)
	e.disableCoverageTrigger()
	e.exec(`ALTER PUBLICATION outboxrelay DROP TABLE outbox`)
	e.exec(`ALTER EVENT TRIGGER outboxrelay_coverage ENABLE`)
	if _, err := e.db.Exec(t.Context(), `CREATE TABLE unrelated (id int)`); err != nil {
		t.Fatalf("CREATE TABLE of an unrelated table: %v", err)
	}
	if _, err := e.db.Exec(t.Context(), `ALTER TABLE unrelated ADD COLUMN note text`); err != nil {
		t.Fatalf("ALTER TABLE of an unrelated table: %v", err)
	}
	if _, err := e.db.Exec(t.Context(), `ALTER TABLE outbox ADD COLUMN note text`); err == nil || !strings.Contains(err.Error(), "out of publication") {
		t.Fatalf("ALTER TABLE outbox with the table out of the publication: %v, want it refused", err)
	}
	e.exec(`ALTER PUBLICATION outboxrelay ADD TABLE outbox`)
	e.exec(`ALTER TABLE outbox ADD COLUMN note text`)
}
