package integration

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The first start on a slot that exists without a recorded position, as a
// DBA, infrastructure code or `migrate --slot` makes it: each row committed
// before the relay streams comes once, from the table or from the slot,
// whichever holds it, and the log says how many came from each.

// firstStart is one scenario's database: migrate made the table and the
// publication without a slot, and the ledger keeps every committed row in
// commit order per aggregate.
type firstStart struct {
	*env
	l   *commitLedger
	seq int
}

func newFirstStart(t *testing.T, migrateArgs ...string) *firstStart {
	t.Helper()
	return &firstStart{env: newEnvWith(t, serverFor(t), "", append([]string{"--slot", ""}, migrateArgs...)...), l: newCommitLedger()}
}

// commit writes n rows over five aggregates, in transactions of ten.
func (f *firstStart) commit(n int) {
	f.t.Helper()
	for n > 0 {
		k := min(n, 10)
		agg := strconv.Itoa(f.seq % 5)
		f.seq++
		f.l.commit(agg, f.insert("public.outbox", "fs", agg, k)...)
		n -= k
	}
}

// insertIn writes n rows of aggregate agg in tx and returns their ids.
func insertIn(t *testing.T, tx pgx.Tx, agg string, n int) []string {
	t.Helper()
	rows, err := tx.Query(t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'fs', $1, 'fs.created', jsonb_build_object('seq', g) FROM generate_series(1, $2) g RETURNING id::text`, agg, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// createSlotSQL creates the relay's slot as a DBA would.
func (f *firstStart) createSlotSQL() {
	f.t.Helper()
	f.exec("SELECT pg_create_logical_replication_slot('outboxrelay', 'pgoutput')")
}

// run starts the relay for the first time, commits after more rows while
// it streams, and checks what the broker holds: every row once, each
// aggregate's in commit order. It returns the relay's output.
func (f *firstStart) run(after int) string {
	f.t.Helper()
	held := len(f.l.ids)
	p := f.start()
	p.waitLog(`"streaming"`, 60*time.Second)
	f.commit(after)
	// A last row the stream delivers after every other: once the slot has
	// confirmed it, the broker holds all the relay will publish.
	f.commit(1)
	var lsn string
	if err := f.db.QueryRow(f.t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		f.t.Fatal(err)
	}
	c := f.consume("outbox.fs")
	c.waitIDs(f.l.ids, 60*time.Second)
	if !f.waitSlotPast(lsn, 30*time.Second) {
		f.t.Fatalf("the slot did not confirm %s", lsn)
	}
	time.Sleep(time.Second) // for any message published twice to arrive
	recs := c.records()
	p.stop()
	dups := duplicates(recs)
	if dups != 0 {
		f.t.Errorf("%d of %d rows arrived twice (%d messages in the topic), want each once", dups, len(f.l.ids), len(recs))
	}
	bad := f.l.check(f.t, recs)
	f.t.Logf("first-start figures: %d rows committed before the first start, %d after; %d messages in the topic, duplicates %d, aggregates out of order %d",
		held, len(f.l.ids)-held, len(recs), dups, bad)
	return p.out.String()
}

// wantCounts checks the first start's log line: published rows from the
// table, the rows it left to the slot.
func wantCounts(t *testing.T, out string, published, leftToSlot int) {
	t.Helper()
	m := regexp.MustCompile(`first start: published from the outbox tables[^\n]*"published":(\d+)[^\n]*"left_to_slot":(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Errorf("no first-start line with published and left_to_slot in the log")
		return
	}
	if m[1] != strconv.Itoa(published) || m[2] != strconv.Itoa(leftToSlot) {
		t.Errorf("the first start logged published %s, left_to_slot %s; want %d from the table and %d left to the slot", m[1], m[2], published, leftToSlot)
	}
}

// TestFirstStartSQLSlotAfterRows is issue 49's setup: 150 rows, then the
// slot made with SQL, then 250 rows, then the relay's first start.
func TestFirstStartSQLSlotAfterRows(t *testing.T) {
	f := newFirstStart(t)
	f.commit(150)
	f.createSlotSQL()
	f.commit(250)
	wantCounts(t, f.run(100), 150, 250)
}

// TestFirstStartSQLSlotPartitioned is TestFirstStartSQLSlotAfterRows on a
// partitioned outbox: the slot names the rows' table by its root, the
// table read finds them in the partitions.
func TestFirstStartSQLSlotPartitioned(t *testing.T) {
	f := newFirstStart(t, "--partitioned")
	f.commit(60)
	f.createSlotSQL()
	f.commit(90)
	wantCounts(t, f.run(30), 60, 90)
}

// TestFirstStartSQLSlotBeforeRows: the slot is made with SQL before any
// row, so the slot holds every one and the table gives none.
func TestFirstStartSQLSlotBeforeRows(t *testing.T) {
	f := newFirstStart(t)
	f.createSlotSQL()
	f.commit(200)
	out := f.run(100)
	wantCounts(t, out, 0, 200)
}

// TestFirstStartMigrateSlotRerun: `migrate --slot` makes the slot while a
// transaction that began before it (a read) has yet to write; it writes
// and commits after the slot exists, so the slot holds it although it
// began before the slot was created.
func TestFirstStartMigrateSlotRerun(t *testing.T) {
	f := newFirstStart(t)
	ctx := t.Context()
	f.commit(100)
	tx := beginT(t, f.dbURL)
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM public.outbox"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // its now(), the rows' created_at, before the slot
	if out, code := f.cli("migrate", "--database-url", f.dbURL); code != 0 {
		t.Fatalf("migrate exited %d: %s", code, out)
	}
	ids := insertIn(t, tx, "0", 20)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.l.commit("0", ids...)
	f.commit(100)
	wantCounts(t, f.run(100), 100, 120)
}

// TestFirstStartSlotDuringTransaction: a transaction writes, the slot is
// made with SQL from another connection (PostgreSQL makes it wait for the
// transaction), the transaction writes more and commits. The slot holds
// none of it: the whole transaction comes from the table, once.
func TestFirstStartSlotDuringTransaction(t *testing.T) {
	f := newFirstStart(t)
	ctx := t.Context()
	f.commit(50)
	tx := beginT(t, f.dbURL)
	ids := insertIn(t, tx, "1", 20)
	slot := connectT(t, f.dbURL)
	made := make(chan error, 1)
	go func() {
		_, err := slot.Exec(ctx, "SELECT pg_create_logical_replication_slot('outboxrelay', 'pgoutput')")
		made <- err
	}()
	f.waitSlotCreating()
	ids = append(ids, insertIn(t, tx, "1", 20)...)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.l.commit("1", ids...)
	if err := <-made; err != nil {
		t.Fatal(err)
	}
	f.commit(100)
	wantCounts(t, f.run(100), 90, 100)
}

// beginT opens a transaction on a connection of its own.
func beginT(t *testing.T, url string) pgx.Tx {
	t.Helper()
	tx, err := connectT(t, url).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// waitSlotCreating waits until the slot exists and is still being made:
// waiting for the transactions running to end.
func (f *firstStart) waitSlotCreating() {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		err := f.db.QueryRow(f.t.Context(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE query LIKE 'SELECT pg_create_logical_replication_slot%' AND wait_event_type = 'Lock')`).Scan(&waiting)
		if err != nil {
			f.t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the slot's creation never waited for the open transaction")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFirstStartSlotInUse: another process streams from the slot, so the
// first start cannot peek it. It stops with one line naming the fix and
// records nothing, and once the slot is free the next start is a first
// start that publishes each row once.
func TestFirstStartSlotInUse(t *testing.T) {
	f := newFirstStart(t)
	ctx := t.Context()
	f.commit(30)
	f.createSlotSQL()
	f.commit(40)

	cfg, err := pgconn.ParseConfig(f.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	other, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, other, "outboxrelay", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'outboxrelay'"}}); err != nil {
		t.Fatal(err)
	}
	out, code := f.cliConfig(f.configText())
	if code == 0 || !strings.Contains(out, "stop the process that reads replication slot outboxrelay") {
		t.Fatalf("the relay exited %d, want a failed start naming the process that holds the slot:\n%s", code, tail(out, 20))
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "stop the process") {
			t.Logf("the failed start: %s", line)
			break
		}
	}
	var recorded bool
	if err := f.db.QueryRow(ctx, "SELECT EXISTS (SELECT FROM outboxrelay.checkpoint WHERE slot = 'outboxrelay' AND confirmed_lsn IS NOT NULL)").Scan(&recorded); err != nil || recorded {
		t.Fatalf("a position recorded after the failed start: %v %v", recorded, err)
	}
	other.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var active bool
		if err := f.db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'outboxrelay'").Scan(&active); err != nil {
			t.Fatal(err)
		}
		if !active || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantCounts(t, f.run(20), 30, 40)
}

// TestFirstStartSameIDsInTwoTables: two outbox tables whose rows share
// ids (as two bigserial columns would), one table's rows committed before
// the slot and the other's after. What the slot holds is told apart by
// table as well as id: each table's rows come once, none is taken for
// the other's.
func TestFirstStartSameIDsInTwoTables(t *testing.T) {
	f := newFirstStart(t)
	if out, code := f.cli("migrate", "--database-url", f.dbURL, "--table", "public.outbox2", "--slot", ""); code != 0 {
		t.Fatalf("migrate --table public.outbox2 exited %d: %s", code, out)
	}
	ids := f.insert("public.outbox", "one", "a", 30)
	f.createSlotSQL()
	f.exec(`INSERT INTO public.outbox2 (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT id, 'two', aggregate_id, 'two.created', payload FROM public.outbox`)
	cfg := strings.Replace(f.configText(), "postgres:\n", "postgres:\n  tables: [public.outbox, public.outbox2]\n", 1)
	p := f.startConfig(cfg)
	p.waitLog(`"streaming"`, 60*time.Second)
	c1, c2 := f.consume("outbox.one"), f.consume("outbox.two")
	c1.waitIDs(ids, 60*time.Second)
	c2.waitIDs(ids, 60*time.Second)
	time.Sleep(time.Second) // for any message published twice to arrive
	one, two := c1.records(), c2.records()
	p.stop()
	if len(one) != len(ids) || len(two) != len(ids) {
		t.Errorf("outbox.one holds %d messages and outbox.two %d, want %d each", len(one), len(two), len(ids))
	}
	wantCounts(t, p.out.String(), len(ids), len(ids))
}
