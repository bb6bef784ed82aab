package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// commitLedger is the commit order of each aggregate's messages, as the test
// committed them.
type commitLedger struct {
	order map[string][]string // aggregate id -> message ids in commit order
	ids   []string
}

func newCommitLedger() *commitLedger { return &commitLedger{order: map[string][]string{}} }

func (l *commitLedger) commit(agg string, ids ...string) {
	l.order[agg] = append(l.order[agg], ids...)
	l.ids = append(l.ids, ids...)
}

// check fails t for every aggregate whose first deliveries in recs are not
// in the ledger's order, and returns how many aggregates were out of order.
func (l *commitLedger) check(t *testing.T, recs []record) int {
	t.Helper()
	pos := map[string]int{}
	for _, ids := range l.order {
		for i, id := range ids {
			pos[id] = i
		}
	}
	seen := map[string]bool{}
	last := map[string]int{}
	bad := map[string]bool{}
	for _, r := range recs {
		id := r.Headers["message_id"]
		p, ours := pos[id]
		if !ours || seen[id] {
			continue
		}
		seen[id] = true
		if prev, ok := last[r.Key]; ok && p < prev {
			if !bad[r.Key] {
				t.Errorf("aggregate %s: its message #%d arrived after #%d", r.Key, p, prev)
			}
			bad[r.Key] = true
		}
		last[r.Key] = p
	}
	return len(bad)
}

// TestRecoverCommitOrder republishes, after the slot was dropped, rows whose
// table position, creation time and transaction id disagree with their
// commit order: multi-statement and multi-row transactions over many
// aggregates in a table with space freed at its start (so a transaction's
// later rows land on earlier pages), and transactions that began before
// others of their aggregate committed but wrote after. Every message must
// arrive, each aggregate's in commit order.
func TestRecoverCommitOrder(t *testing.T) {
	recoverCommitOrder(t, newEnv(t))
}

// TestRecoverCommitOrderCommitTimestamps is TestRecoverCommitOrder with
// track_commit_timestamp = on, which orders transactions by commit time.
func TestRecoverCommitOrderCommitTimestamps(t *testing.T) {
	srv := pgservertest.Start(t, pgserver.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	e := newEnvOn(t, srv)
	var on string
	if err := e.db.QueryRow(t.Context(), "SHOW track_commit_timestamp").Scan(&on); err != nil || on != "on" {
		t.Fatalf("track_commit_timestamp = %q (%v), want on", on, err)
	}
	recoverCommitOrder(t, e)
}

func recoverCommitOrder(t *testing.T, e *env) {
	cfg := e.config()
	ctx := t.Context()
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	e.insert("public.outbox", "warmup", "0", 1)
	kafkaRecords(t, e.brokers, "outbox.warmup", 1)
	p.stop()
	e.exec("SELECT pg_drop_replication_slot('outboxrelay')")

	// Filler rows, some of which are deleted before a transaction begins
	// and vacuumed while it runs: its first rows go on the table's last
	// page, its later ones into the space the vacuum freed on earlier pages.
	e.exec(`INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'filler', g::text, 'filler', '{}' FROM generate_series(1, 6000) g`)
	vac := connectT(t, e.dbURL)
	freed := 0
	l := newCommitLedger()
	insert := func(tx pgx.Tx, agg string, seq int) string {
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('ordered', $1, 'ordered.step', jsonb_build_object('seq', $2::int)) RETURNING id::text`, agg, seq).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	other := connectT(t, e.dbURL)
	seq := 0
	const aggregates = 12
	for round := 0; round < 30; round++ {
		// A transaction of another session begins now (its rows' created_at)
		// but writes only after this round's transaction has committed.
		var late pgx.Tx
		lateAgg := fmt.Sprintf("agg-%d", round%aggregates)
		if round%3 == 0 {
			var err error
			if late, err = other.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := late.Exec(ctx, "SELECT now()"); err != nil {
				t.Fatal(err)
			}
		}
		vacuum := round%3 == 1 && freed < 5
		if vacuum {
			// Committed before the transaction takes its id, so that the
			// vacuum may remove the rows.
			if _, err := vac.Exec(ctx, `DELETE FROM public.outbox WHERE aggregate_type = 'filler' AND (ctid::text::point)[0] >= $1 AND (ctid::text::point)[0] < $2`,
				freed*6, freed*6+6); err != nil {
				t.Fatal(err)
			}
			freed++
		}
		tx, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pending := map[string][]string{}
		// Statements of four aggregates, interleaved: one row each.
		for step := 0; step < 20; step++ {
			if vacuum && step == 10 {
				if _, err := vac.Exec(ctx, "VACUUM public.outbox"); err != nil {
					t.Fatal(err)
				}
			}
			agg := fmt.Sprintf("agg-%d", (round+step%4)%aggregates)
			seq++
			pending[agg] = append(pending[agg], insert(tx, agg, seq))
		}
		// One multi-row statement, with ids generated in order (UUIDv7, as
		// the outbox library does).
		batchAgg := fmt.Sprintf("agg-%d", (round+5)%aggregates)
		var batch []string
		for i := 0; i < 10; i++ {
			id, err := uuid.NewV7()
			if err != nil {
				t.Fatal(err)
			}
			batch = append(batch, id.String())
		}
		if _, err := tx.Exec(ctx, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT u.id, 'ordered', $2, 'ordered.batch', jsonb_build_object('n', u.n) FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n) ORDER BY u.n`,
			batch, batchAgg); err != nil {
			t.Fatal(err)
		}
		pending[batchAgg] = append(pending[batchAgg], batch...)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for agg, ids := range pending {
			l.commit(agg, ids...)
		}
		if late != nil {
			var ids []string
			for i := 0; i < 3; i++ {
				seq++
				ids = append(ids, insert(late, lateAgg, seq))
			}
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			l.commit(lateAgg, ids...)
		}
	}

	// What the scenario exercised: within a transaction, rows whose table
	// position is before that of rows inserted earlier; and transactions
	// whose creation time is before that of one committed earlier.
	var backwards, earlyStart int
	if err := e.db.QueryRow(ctx, `WITH r AS (SELECT id::text AS id, aggregate_id, xmin::text AS x, ctid, created_at FROM public.outbox WHERE aggregate_type = 'ordered'),
			l AS (SELECT * FROM unnest($1::text[]) WITH ORDINALITY AS l(id, n))
		SELECT (SELECT count(*) FROM r a JOIN l la ON la.id = a.id JOIN r b ON b.x = a.x AND b.aggregate_id = a.aggregate_id JOIN l lb ON lb.id = b.id
		         WHERE la.n < lb.n AND a.ctid > b.ctid),
		       (SELECT count(*) FROM r a JOIN l la ON la.id = a.id JOIN r b ON b.aggregate_id = a.aggregate_id JOIN l lb ON lb.id = b.id
		         WHERE la.n < lb.n AND a.created_at > b.created_at)`, l.ids).Scan(&backwards, &earlyStart); err != nil {
		t.Fatal(err)
	}
	if backwards == 0 || earlyStart == 0 {
		t.Fatalf("the table does not exercise the order: %d pairs placed backwards in a transaction, %d pairs created in the opposite of commit order", backwards, earlyStart)
	}

	out, code := e.cli("recover", "--config", cfg)
	if code != 0 || !strings.Contains(out, "recovered") {
		t.Fatalf("recover exited %d:\n%s", code, out)
	}
	recs := e.consume("outbox.ordered").waitIDs(l.ids, 60*time.Second)
	bad := l.check(t, recs)
	t.Logf("commit order figures: %d rows of %d aggregates in 40 transactions; %d row pairs placed backwards in the table, %d created before an earlier commit; republished %d records, %d aggregates out of order",
		len(l.ids), len(l.order), backwards, earlyStart, len(recs), bad)
}

// TestRecoverDeadLetteredRows recovers windows that hold rows the broker
// refuses (a topic Kafka does not allow): those the relay already
// dead-lettered stay in the dead letters, those it never saw are
// dead-lettered by recover, the checkpoint is reset either way, and the
// relay then runs.
func TestRecoverDeadLetteredRows(t *testing.T) {
	e := newEnv(t)
	e.extra = "relay:\n  max_attempts: 2\n"
	cfg := e.config()
	ctx := t.Context()
	deadLetters := func() int {
		t.Helper()
		var n int
		if err := e.db.QueryRow(ctx, "SELECT count(*) FROM outboxrelay.dead_letters WHERE replayed_at IS NULL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	bad := func(n int, tag string) {
		t.Helper()
		for i := 0; i < n; i++ {
			e.insert("public.outbox", "bad topic", fmt.Sprintf("%s-%d", tag, i), 1)
		}
	}
	l := newCommitLedger()
	good := func(agg string, n int) { l.commit(agg, e.insert("public.outbox", "order", agg, n)...) }

	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	good("1", 10)
	bad(3, "a")
	good("1", 5)
	good("2", 5)
	deadline := time.Now().Add(60 * time.Second)
	for deadLetters() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d dead letters after 60s, want 3", deadLetters())
		}
		time.Sleep(100 * time.Millisecond)
	}
	kafkaRecords(t, e.brokers, "outbox.order", len(l.ids))
	p.stop()

	// A healthy slot, recovered anyway: the three dead letters are in the window.
	out, code := e.cli("recover", "--config", cfg, "--since", "1h", "--force")
	if code != 0 || !strings.Contains(out, "recovered") || !strings.Contains(out, "3 messages of the window wait in outboxrelay.dead_letters") {
		t.Fatalf("recover --force over dead-lettered rows exited %d, want 0 with the 3 dead letters left:\n%s", code, out)
	}
	if strings.Contains(out, "ahead of") || !strings.Contains(out, "is healthy") {
		t.Errorf("recover of a healthy slot calls it ahead of the record, or not healthy:\n%s", out)
	}
	if n := deadLetters(); n != 3 {
		t.Errorf("%d dead letters after recover, want the 3 there were", n)
	}
	forced := out

	// Rows the relay never saw, among them two the broker refuses.
	e.exec("SELECT pg_drop_replication_slot('outboxrelay')")
	good("1", 5)
	bad(2, "b")
	good("2", 5)
	out, code = e.cli("recover", "--config", cfg, "--since", "1h")
	if code != 1 || !strings.Contains(out, "recovered: start the relay") || !strings.Contains(out, "2 messages the broker refused, or invalid rows, were dead-lettered") {
		t.Fatalf("recover over refused rows exited %d, want 1 (README: messages the broker refused) after recovering:\n%s", code, out)
	}
	if n := deadLetters(); n != 5 {
		t.Errorf("%d dead letters after the second recover, want 5", n)
	}

	p = e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	good("1", 5)
	recs := e.consume("outbox.order").waitIDs(l.ids, 60*time.Second)
	p.stop()
	l.check(t, recs)
	t.Logf("dead-letter recovery figures: %d good rows, 5 refused; recover --force exit 0, then recover exit 1 with 2 new dead letters (5 in all); the relay then streamed; duplicates %d\n%s\n%s",
		len(l.ids), duplicates(recs), forced, out)
}

// newEnvOwner is newEnv migrated by an owner without REPLICATION, as on a
// managed database: migrate creates no slot. preMigrate (SQL) runs as the
// owner first. The relay and e.db use the server's superuser.
func newEnvOwner(t *testing.T, preMigrate string) *env {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	url, err := serverFor(t).CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	owner := "owner_" + name
	admin := connectT(t, url)
	for _, sql := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN NOREPLICATION", owner),
		fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", name, owner),
		fmt.Sprintf("ALTER SCHEMA public OWNER TO %s", owner),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		for attempt := 0; attempt < 50; attempt++ {
			c.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
				WHERE database = current_database() AND active_pid IS NOT NULL`)
			c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			var left int
			if c.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&left) != nil || left == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Exec(context.Background(), fmt.Sprintf("REASSIGN OWNED BY %s TO postgres", owner))
		c.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %s", owner))
		c.Exec(context.Background(), "DROP ROLE "+owner)
	})
	ownerURL := strings.Replace(url, "postgres://postgres@", "postgres://"+owner+"@", 1)
	if preMigrate != "" {
		c := connectT(t, ownerURL)
		if _, err := c.Exec(ctx, preMigrate); err != nil {
			t.Fatalf("%s: %v", preMigrate, err)
		}
	}
	e := &env{t: t, dbURL: ownerURL}
	out, code := e.cli("migrate", "--database-url", ownerURL)
	if code != 0 || !strings.Contains(out, "has no REPLICATION") {
		t.Fatalf("migrate as %s exited %d, want 0 without a slot:\n%s", owner, code, out)
	}
	e.dbURL = url
	e.db = admin
	var slots int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("slots after migrate: %d %v, want none", slots, err)
	}
	e.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.brokers = e.kafka.ListenAddrs()[0]
	return e
}

// TestFirstStartPublishesRowsBeforeSlot: migrate ran as an owner without
// REPLICATION, so no slot exists while the service commits rows; a writer
// keeps committing while the relay makes its first start. Every row must
// arrive exactly once, each aggregate's in commit order.
func TestFirstStartPublishesRowsBeforeSlot(t *testing.T) {
	e := newEnvOwner(t, "")
	ctx := t.Context()
	l := newCommitLedger()
	var mu sync.Mutex
	writer := connectT(t, e.dbURL)
	txn := func(n int) {
		t.Helper()
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		pending := map[string][]string{}
		for step := 0; step < 6; step++ {
			agg := fmt.Sprintf("agg-%d", (n+step%3)%8)
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('first', $1, 'first.step', jsonb_build_object('txn', $2::int, 'step', $3::int)) RETURNING id::text`, agg, n, step).Scan(&id); err != nil {
				_ = tx.Rollback(ctx)
				t.Error(err)
				return
			}
			pending[agg] = append(pending[agg], id)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		for agg, ids := range pending {
			l.commit(agg, ids...)
		}
		mu.Unlock()
	}
	for n := 0; n < 40; n++ {
		txn(n)
	}
	before := len(l.ids)

	// Commits go on through the relay's first start.
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 40
		for {
			select {
			case <-stop:
				done <- n - 40
				return
			default:
			}
			txn(n)
			n++
			time.Sleep(2 * time.Millisecond)
		}
	}()
	p := e.start()
	p.waitLog(`"streaming"`, 60*time.Second)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	during := <-done
	if t.Failed() {
		t.FailNow()
	}
	mu.Lock()
	ids := append([]string(nil), l.ids...)
	mu.Unlock()
	recs := e.consume("outbox.first").waitIDs(ids, 60*time.Second)
	p.stop()
	if n := duplicates(recs); n != 0 {
		t.Errorf("%d messages arrived twice, want each once", n)
	}
	bad := l.check(t, recs)
	if !strings.Contains(p.out.String(), "first start: published from the outbox tables the rows committed before the replication slot's start") {
		t.Errorf("the relay did not log its first-start publish")
	}
	t.Logf("first-start figures: %d rows committed before the slot existed, %d in %d transactions during the first start; received %d records, duplicates %d, aggregates out of order %d",
		before, len(ids)-before, during, len(recs), duplicates(recs), bad)
}

// TestFirstStartAdoptedTable: an outbox table that held rows before
// migrate adopted it (delivered by another tool) starts from now: nothing
// old is republished, and the relay says how to publish it anyway.
func TestFirstStartAdoptedTable(t *testing.T) {
	e := newEnvOwner(t, outboxDDL+`;
		INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'adopted', (g % 5)::text, 'adopted.old', jsonb_build_object('seq', g) FROM generate_series(1, 50) g`)
	p := e.start()
	p.waitLog(`"streaming"`, 60*time.Second)
	ids := e.insert("public.outbox", "adopted", "1", 5)
	e.consume("outbox.adopted").waitIDs(ids, 60*time.Second)
	time.Sleep(500 * time.Millisecond) // for older rows, were any published
	recs := e.consume("outbox.adopted").waitIDs(ids, 10*time.Second)
	p.stop()
	if len(recs) != len(ids) {
		t.Errorf("%d records in outbox.adopted, want only the %d rows committed after the start (50 older rows not republished)", len(recs), len(ids))
	}
	if !strings.Contains(p.out.String(), "postgres.backfill: all") {
		t.Errorf("the relay did not say how to publish the older rows")
	}
	t.Logf("adopted-table figures: 50 rows before migrate, %d after the start; received %d", len(ids), len(recs))
}

// TestFirstStartAfterMigrateSlotRerun: rows are committed with no slot,
// then a `migrate` rerun by a role with REPLICATION creates the slot, and
// more rows are committed into it. The relay's first start publishes the
// rows from before the slot and streams the later ones: each once, in
// commit order. A fresh configuration (another slot) pointed at the same
// table afterwards republishes none of them.
func TestFirstStartAfterMigrateSlotRerun(t *testing.T) {
	e := newEnvOwner(t, "")
	l := newCommitLedger()
	for i := 0; i < 10; i++ {
		l.commit(fmt.Sprint(i%4), e.insert("public.outbox", "rerun", fmt.Sprint(i%4), 3)...)
	}
	before := len(l.ids)
	out, code := e.cli("migrate", "--database-url", e.dbURL)
	if code != 0 || !strings.Contains(out, "replication slot outboxrelay created") {
		t.Fatalf("migrate rerun with REPLICATION exited %d, want 0 creating the slot:\n%s", code, out)
	}
	for i := 0; i < 10; i++ {
		l.commit(fmt.Sprint(i%4), e.insert("public.outbox", "rerun", fmt.Sprint(i%4), 3)...)
	}
	p := e.start()
	p.waitLog(`"streaming"`, 60*time.Second)
	recs := e.consume("outbox.rerun").waitIDs(l.ids, 60*time.Second)
	p.stop()
	if n := duplicates(recs); n != 0 {
		t.Errorf("%d messages arrived twice, want each once", n)
	}
	l.check(t, recs)

	second := strings.Replace(e.configText(), "    brokers:", "    topic: \"second.{aggregate_type}\"\n    brokers:", 1)
	second = strings.Replace(second, "  status_interval: 200ms\n", "  status_interval: 200ms\n  slot: second\n", 1)
	p = e.startConfig(second)
	p.waitLog(`"streaming"`, 60*time.Second)
	fresh := e.insert("public.outbox", "rerun", "0", 4)
	e.consume("second.rerun").waitIDs(fresh, 60*time.Second)
	time.Sleep(500 * time.Millisecond) // for older rows, were any published
	got := e.consume("second.rerun").waitIDs(fresh, 10*time.Second)
	p.stop()
	if len(got) != len(fresh) {
		t.Errorf("the fresh configuration published %d records, want only the %d rows committed after it started", len(got), len(fresh))
	}
	t.Logf("migrate-rerun figures: %d rows before the slot, %d after; received %d, duplicates %d; a second slot then published %d of %d older rows",
		before, len(l.ids)-before, len(recs), duplicates(recs), len(got)-len(fresh), len(l.ids))
}
