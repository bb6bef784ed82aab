package integration

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// The nemesis writes rows over many aggregates and transactions while it
// injects random faults into every part the relay depends on, then checks
// what the consumer received against the ledger of committed rows.
//
// OUTBOXRELAY_NEMESIS_DURATION sets how long faults are injected (default
// 35s; `make torture DURATION=10m`), OUTBOXRELAY_NEMESIS_SEED repeats a
// fault schedule and the writers' choices (the timing still differs).
const (
	nemesisDefaultDuration = 35 * time.Second
	nemesisWriters         = 4 // each owns its aggregates, so it knows their commit order
	nemesisAggregates      = 6 // per writer
	nemesisDrainTimeout    = 90 * time.Second
)

// TestNemesisKafka runs the nemesis against kfake: broker restarts on the
// same port and data directory, produce connections cut, retriable produce
// and metadata errors (NOT_LEADER_FOR_PARTITION, UNKNOWN_TOPIC_OR_PARTITION,
// REQUEST_TIMED_OUT after the append, ...), besides the relay and PostgreSQL
// faults every run has.
func TestNemesisKafka(t *testing.T) {
	runNemesis(t, func(e *env) *nemesisTarget { return newKafkaNemesis(t, e) })
}

// TestNemesisRabbitMQ runs the nemesis against RabbitMQ: the relay's
// connections cut or closed by the broker, and nacks from a reject-publish
// queue of x-max-length 20 whose consumer slows down, besides the relay and
// PostgreSQL faults every run has.
func TestNemesisRabbitMQ(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
	runNemesis(t, func(*env) *nemesisTarget { return newRabbitNemesis(t) })
}

func runNemesis(t *testing.T, newTarget func(*env) *nemesisTarget) {
	duration := nemesisDuration(t)
	seed := nemesisSeed(t)
	// A server of the test's own: the nemesis restarts and crashes it.
	srv, _ := startServer(t, map[string]string{
		"logical_decoding_work_mem": "64kB", // big transactions spill
		"max_wal_senders":           "10",
		"max_replication_slots":     "10",
	})
	e := newEnvOn(t, srv)
	// Every transaction records its number here, so that a writer whose
	// COMMIT got no answer can find out whether it committed. The table is
	// not in the publication.
	e.exec("CREATE TABLE nemesis_txn (id bigint PRIMARY KEY)")
	target := newTarget(e)
	t.Logf("nemesis %s: %s of faults, seed %d (OUTBOXRELAY_NEMESIS_SEED=%d repeats it)", target.name, duration, seed, seed)

	// Two attempts, so that the poison rows are dead-lettered quickly;
	// retriable failures are retried without limit regardless.
	relay := newRelayRunner(e, append(slices.Clone(target.env), "OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2"))
	relay.start()
	relay.current().waitLog(`"streaming"`, 30*time.Second)
	superviseCtx, stopSupervising := context.WithCancel(context.Background())
	supervised := make(chan struct{})
	go func() {
		defer close(supervised)
		relay.supervise(superviseCtx)
	}()
	defer func() {
		stopSupervising()
		<-supervised
	}()

	led := newLedger()
	var writers sync.WaitGroup
	defer writers.Wait() // after stopWriting: no writer may outlive the test
	writeCtx, stopWriting := context.WithCancel(t.Context())
	defer stopWriting()
	var txSeq atomic.Int64
	for w := range nemesisWriters {
		writers.Add(1)
		go func() {
			defer writers.Done()
			led.write(writeCtx, t, e.dbURL, w, target.poisonType, rand.New(rand.NewPCG(seed, uint64(w)+1)), &txSeq)
		}()
	}

	// The faults, in rounds that each inject every kind once in a random
	// order, so that even a short run has them all. A fault can miss (a
	// window of produce errors while the relay is down); past the duration,
	// the kinds that took effect fewer than the minimum are injected again,
	// for at most a grace period.
	faults := append(commonFaults(srv, e.dbURL, relay), target.faults...)
	least := nemesisMinimums(duration, len(faults))
	tally := newFaultTally()
	var windows sync.WaitGroup
	defer windows.Wait()
	faultCtx, endFaults := context.WithCancel(t.Context())
	defer endFaults()
	r := rand.New(rand.NewPCG(seed, 0))
	var round []int
	faultsStart := time.Now()
	faultsEnd := faultsStart.Add(duration)
	for grace := faultsEnd.Add(least.grace); !t.Failed(); {
		now := time.Now()
		short := tally.short(faults, least.faultsPerKind)
		if !now.Before(faultsEnd) && (len(short) == 0 || !now.Before(grace)) {
			break
		}
		if len(round) == 0 {
			round = r.Perm(len(faults))
		}
		f := faults[round[0]]
		round = round[1:]
		if !now.Before(faultsEnd) && !slices.Contains(short, f.kind) {
			continue
		}
		if err := f.inject(faultCtx, r, &windows, tally.hit(f.kind)); err != nil {
			t.Errorf("inject %s: %v", f.kind, err)
			continue
		}
		sleepCtx(faultCtx, time.Duration(500+r.IntN(2000))*time.Millisecond)
	}
	faultTime := time.Since(faultsStart)
	endFaults()
	windows.Wait()
	target.heal()
	stopWriting()
	writers.Wait()

	// Every committed row must arrive, or be a dead letter.
	var dead map[string]int
	var arrivals []arrival
	deadline := time.Now().Add(nemesisDrainTimeout)
	for {
		arrivals = target.arrivals()
		var err error
		if dead, err = deadLetters(t.Context(), e.dbURL); err == nil && led.unaccounted(arrivals, dead) == 0 {
			break
		}
		if time.Now().After(deadline) || t.Context().Err() != nil {
			t.Errorf("rows still unaccounted for %s after the faults ended (last dead-letter query error: %v)", nemesisDrainTimeout, err)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(time.Second) // a late copy of a rolled-back row would arrive now
	stopSupervising()
	<-supervised
	relay.stop()
	arrivals = target.arrivals()
	if d, err := deadLetters(t.Context(), e.dbURL); err != nil {
		t.Errorf("dead letters: %v", err)
	} else {
		dead = d
	}

	v := led.verify(t, arrivals, dead)
	led.checkTable(t, e.dbURL)
	led.checkMinimums(t, least)
	tally.check(t, faults, least.faultsPerKind)
	t.Logf("nemesis %s figures (%s of faults, seed %d):", target.name, faultTime.Round(100*time.Millisecond), seed)
	t.Logf("  written: %s", led.figures())
	t.Logf("  faults injected: %s; took effect: %s; %s", formatCounts(tally.injectedCounts()), formatCounts(tally.effectiveCounts()), target.figures())
	t.Logf("  minimums for %s: %s", duration, least)
	t.Logf("  relay: %s", relay.figures())
	t.Logf("  checked: rows committed %d, lost %d, duplicates %d (records %d), rolled-back rows published %d, order violations %d, dead letters %d (%d poison rows, %d others)",
		v.committed, v.lost, v.duplicates, len(arrivals), v.rolledBackPublished, v.orderViolations, v.deadTotal, v.deadPoison, v.deadOther)
}

// nemesisMin is what a run must at least have done to prove anything: a
// run whose writers committed nothing, or whose faults all missed, passes
// every check of the ledger.
type nemesisMin struct {
	rows, rollbacks, savepointRows int // committed rows, rolled-back transactions, rows under rolled-back savepoints
	faultsPerKind                  int // injections of each kind that took effect
	grace                          time.Duration
}

// nemesisMinimums derives the minimums from the duration of the faults and
// the number of kinds, a small fraction of what a loaded 2-core machine
// did: about 330 rows, 6 rolled-back transactions and 30 rows under
// rolled-back savepoints a second, and an injection every 2.3 s (35 s of
// Kafka faults: 11,408 rows, 235 rollbacks, 970 savepoint rows, 16
// injections of 8 kinds). The minimums are a thirteenth of that or less (a
// quarter for the faults), so that they hold from 35 s (make test) to
// hours (make torture).
func nemesisMinimums(d time.Duration, kinds int) nemesisMin {
	secs := int(d / time.Second)
	return nemesisMin{
		rows:          20 * secs,
		rollbacks:     secs / 2,
		savepointRows: secs,
		faultsPerKind: max(1, int(d/(time.Duration(kinds)*8*time.Second))),
		grace:         max(30*time.Second, d/4),
	}
}

func (m nemesisMin) String() string {
	return fmt.Sprintf("rows committed %d, transactions rolled back %d, rows under rolled-back savepoints %d, faults of each kind that took effect %d (for up to %s more)",
		m.rows, m.rollbacks, m.savepointRows, m.faultsPerKind, m.grace)
}

// faultTally counts, per kind, the injections and those that took effect
// (hit a request, a connection, a process). Safe for concurrent use: a
// window reports its hits when it ends.
type faultTally struct {
	mu                  sync.Mutex
	injected, effective map[string]int
}

func newFaultTally() *faultTally {
	return &faultTally{injected: map[string]int{}, effective: map[string]int{}}
}

// hit counts one injection of kind and returns the function the fault calls
// with how many times it hit.
func (ft *faultTally) hit(kind string) func(n int64) {
	ft.mu.Lock()
	ft.injected[kind]++
	ft.mu.Unlock()
	return func(n int64) {
		if n <= 0 {
			return
		}
		ft.mu.Lock()
		ft.effective[kind]++
		ft.mu.Unlock()
	}
}

// short lists the kinds that took effect fewer than least times.
func (ft *faultTally) short(faults []nemesisFault, least int) []string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var kinds []string
	for _, f := range faults {
		if ft.effective[f.kind] < least {
			kinds = append(kinds, f.kind)
		}
	}
	return kinds
}

func (ft *faultTally) check(t *testing.T, faults []nemesisFault, least int) {
	t.Helper()
	ft.mu.Lock()
	defer ft.mu.Unlock()
	for _, f := range faults {
		if n := ft.effective[f.kind]; n < least {
			t.Errorf("fault %s took effect %d times (injected %d), want at least %d", f.kind, n, ft.injected[f.kind], least)
		}
	}
}

func (ft *faultTally) injectedCounts() map[string]int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return maps.Clone(ft.injected)
}

func (ft *faultTally) effectiveCounts() map[string]int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return maps.Clone(ft.effective)
}

func nemesisDuration(t *testing.T) time.Duration {
	s := os.Getenv("OUTBOXRELAY_NEMESIS_DURATION")
	if s == "" {
		return nemesisDefaultDuration
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("OUTBOXRELAY_NEMESIS_DURATION=%q is not a positive duration; use e.g. 10m", s)
	}
	return d
}

func nemesisSeed(t *testing.T) uint64 {
	s := os.Getenv("OUTBOXRELAY_NEMESIS_SEED")
	if s == "" {
		return uint64(time.Now().UnixNano())
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("OUTBOXRELAY_NEMESIS_SEED=%q is not an unsigned integer", s)
	}
	return seed
}

// commonFaults are the faults of every run: the relay crashes, PostgreSQL
// restarts or crashes, the walsender is terminated. A kill of a relay that
// had already exited, or a terminate while no walsender ran, did not take
// effect.
func commonFaults(srv *pgserver.Server, dbURL string, relay *relayRunner) []nemesisFault {
	return []nemesisFault{
		{"relay_kill9", func(_ context.Context, r *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
			if relay.kill9(time.Duration(r.IntN(1000)) * time.Millisecond) {
				hit(1)
			}
			return nil
		}},
		{"postgres_restart", func(ctx context.Context, _ *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
			if err := srv.Restart(ctx); err != nil {
				return err
			}
			hit(1)
			return nil
		}},
		{"postgres_crash", func(ctx context.Context, r *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
			if err := srv.Kill(); err != nil {
				return err
			}
			time.Sleep(time.Duration(r.IntN(1000)) * time.Millisecond)
			if err := srv.StartAgain(ctx); err != nil {
				return err
			}
			hit(1)
			return nil
		}},
		{"walsender_terminated", func(ctx context.Context, _ *rand.Rand, _ *sync.WaitGroup, hit func(int64)) error {
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			var n int64
			if err := conn.QueryRow(ctx, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_replication").Scan(&n); err != nil {
				return err
			}
			hit(n)
			return nil
		}},
	}
}

// ledger is what the writers committed and rolled back. Safe for concurrent use.
type ledger struct {
	mu         sync.Mutex
	pos        map[string]int    // committed row -> position in commit order
	agg        map[string]string // committed row -> aggregate_id
	poison     map[string]bool   // committed rows no broker takes: they must be dead-lettered
	where      map[string]string // row -> where it was written, for failure messages
	rolledBack map[string]bool   // rows of rolled-back transactions and savepoints

	commits, rollbacks, inDoubt int
	big, savepointRows, emitted int
	errs                        []string // first errors that left a transaction in doubt
}

func newLedger() *ledger {
	return &ledger{pos: map[string]int{}, agg: map[string]string{}, poison: map[string]bool{}, where: map[string]string{}, rolledBack: map[string]bool{}}
}

// nemesisRow is one row (or table-less message) of a transaction.
type nemesisRow struct {
	id, agg string
	kept    bool // false under a rolled-back savepoint
	poison  bool
	emit    bool   // a table-less message
	where   string // for failure messages: transaction, statement, savepoint
}

// nemesisTx is one transaction as one simple-protocol query.
type nemesisTx struct {
	id     int64
	sql    string
	rows   []nemesisRow
	commit bool
	big    bool
}

// newNemesisTx makes transaction id of writer w: 1-6 rows (rarely 150-300,
// which spill), over the writer's aggregates with one of them hot, some as
// table-less messages, some under savepoints that are rolled back or
// released, now and then a poison row; 8% end in ROLLBACK.
func newNemesisTx(r *rand.Rand, w int, poisonType string, id int64) nemesisTx {
	tx := nemesisTx{id: id, commit: r.IntN(100) >= 8}
	var b strings.Builder
	fmt.Fprintf(&b, "BEGIN;\nINSERT INTO nemesis_txn VALUES (%d);\n", id)
	n := 1 + r.IntN(6)
	pad := ""
	if r.IntN(200) == 0 {
		n, tx.big, pad = 150+r.IntN(150), true, strings.Repeat("x", 200)
	}
	savepoint := ""
	add := func(aggType, agg string, kept, poison bool) {
		row := nemesisRow{id: uuid.NewString(), agg: agg, kept: kept, poison: poison, emit: r.IntN(10) == 0}
		kind := "insert"
		if row.emit {
			kind = "emit"
		}
		row.where = fmt.Sprintf("transaction %d statement %d (%s%s)", id, len(tx.rows)+1, kind, savepoint)
		tx.rows = append(tx.rows, row)
		if row.emit {
			fmt.Fprintf(&b, `SELECT pg_logical_emit_message(true, 'outboxrelay', '{"id": "%s", "aggregate_type": "%s", "aggregate_id": "%s", "event_type": "emitted", "payload": {"tx": %d}}');`+"\n",
				row.id, aggType, agg, id)
			return
		}
		fmt.Fprintf(&b, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ('%s', '%s', '%s', 'created', '{"tx": %d, "pad": "%s"}');`+"\n",
			row.id, aggType, agg, id, pad)
	}
	aggregate := func() string {
		k := 0 // hot
		if r.IntN(10) >= 4 {
			k = r.IntN(nemesisAggregates)
		}
		return fmt.Sprintf("w%d-a%d", w, k)
	}
	for i := range n {
		switch r.IntN(20) {
		case 0:
			fmt.Fprintf(&b, "SAVEPOINT s%d;\n", i)
			savepoint = ", rolled-back savepoint"
			for range 1 + r.IntN(3) {
				add("nemesis", aggregate(), false, false)
			}
			savepoint = ""
			fmt.Fprintf(&b, "ROLLBACK TO SAVEPOINT s%d;\n", i)
		case 1:
			fmt.Fprintf(&b, "SAVEPOINT s%d;\n", i)
			savepoint = ", released savepoint"
			for range 1 + r.IntN(3) {
				add("nemesis", aggregate(), true, false)
			}
			savepoint = ""
			fmt.Fprintf(&b, "RELEASE SAVEPOINT s%d;\n", i)
		}
		add("nemesis", aggregate(), true, false)
	}
	if r.IntN(50) == 0 {
		add(poisonType, fmt.Sprintf("poison-w%d", w), true, true)
	}
	if tx.commit {
		b.WriteString("COMMIT;")
	} else {
		b.WriteString("ROLLBACK;")
	}
	tx.sql = b.String()
	return tx
}

// write commits transactions of writer w until ctx is done. A transaction
// whose outcome is unknown (the connection broke) is looked up once
// PostgreSQL is back, before the next one starts, so the ledger's commit
// order per aggregate is exact.
func (l *ledger) write(ctx context.Context, t *testing.T, url string, w int, poisonType string, r *rand.Rand, txSeq *atomic.Int64) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := connectCtx(ctx, url, 5*time.Second)
			if err != nil {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			conn = c
		}
		tx := newNemesisTx(r, w, poisonType, txSeq.Add(1))
		// Not ctx: stopping the writers must not interrupt a transaction.
		execCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := conn.Exec(execCtx, tx.sql)
		cancel()
		committed := err == nil && tx.commit
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			var rerr error
			if committed, rerr = resolveTx(url, tx.id); rerr != nil {
				t.Errorf("writer %d: transaction %d in doubt (%v) and PostgreSQL unreachable: %v", w, tx.id, err, rerr)
				return
			}
			l.mu.Lock()
			l.inDoubt++
			if len(l.errs) < 3 {
				l.errs = append(l.errs, err.Error())
			}
			l.mu.Unlock()
		}
		l.record(tx, committed)
		sleepCtx(ctx, time.Duration(30+r.IntN(30))*time.Millisecond)
	}
}

func connectCtx(ctx context.Context, url string, timeout time.Duration) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return pgx.Connect(ctx, url)
}

// resolveTx reports whether transaction id committed, waiting up to a
// minute for PostgreSQL to come back.
func resolveTx(url string, id int64) (bool, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := func() (bool, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return false, err
			}
			defer conn.Close(context.Background())
			var ok bool
			err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM nemesis_txn WHERE id = $1)", id).Scan(&ok)
			return ok, err
		}()
		if err == nil || time.Now().After(deadline) {
			return ok, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (l *ledger) record(tx nemesisTx, committed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !committed {
		l.rollbacks++
		for _, row := range tx.rows {
			l.rolledBack[row.id] = true
			l.where[row.id] = row.where + ", rolled back"
		}
		return
	}
	l.commits++
	if tx.big {
		l.big++
	}
	for _, row := range tx.rows {
		l.where[row.id] = row.where
		if !row.kept {
			l.savepointRows++
			l.rolledBack[row.id] = true
			continue
		}
		l.pos[row.id] = len(l.pos)
		l.agg[row.id] = row.agg
		if row.emit {
			l.emitted++
		}
		if row.poison {
			l.poison[row.id] = true
		}
	}
}

// unaccounted counts committed rows that neither arrived nor are dead letters.
func (l *ledger) unaccounted(arrivals []arrival, dead map[string]int) int {
	seen := make(map[string]bool, len(arrivals))
	for _, a := range arrivals {
		seen[a.id] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id := range l.pos {
		if !seen[id] && dead[id] == 0 {
			n++
		}
	}
	return n
}

// verdict is what verify found.
type verdict struct {
	committed, lost, duplicates, rolledBackPublished, orderViolations int
	deadTotal, deadPoison, deadOther                                  int
}

// verify checks the arrivals and dead letters against the ledger: nothing
// lost, no rolled-back row published, the first arrival of every row after
// the first arrivals of the rows committed before it in its aggregate, and
// only poison rows dead-lettered (no injected fault is permanent).
func (l *ledger) verify(t *testing.T, arrivals []arrival, dead map[string]int) verdict {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	v := verdict{committed: len(l.pos)}
	first := map[string]bool{}
	last := map[string]int{} // per aggregate: the latest position that arrived
	lastID := map[string]string{}
	unknown := 0
	for _, a := range arrivals {
		if l.rolledBack[a.id] {
			if v.rolledBackPublished++; v.rolledBackPublished <= 5 {
				t.Errorf("rolled-back row %s (aggregate %s) was published", a.id, a.key)
			}
			continue
		}
		pos, ok := l.pos[a.id]
		if !ok {
			if unknown++; unknown <= 5 {
				t.Errorf("message %s (key %q) is in no transaction of the ledger", a.id, a.key)
			}
			continue
		}
		if first[a.id] {
			v.duplicates++
			continue
		}
		first[a.id] = true
		agg := l.agg[a.id]
		if a.key != agg {
			t.Errorf("row %s of aggregate %s arrived with key %q", a.id, agg, a.key)
		}
		if p, ok := last[agg]; ok && p > pos {
			if v.orderViolations++; v.orderViolations <= 5 {
				t.Errorf("aggregate %s: row %s (commit position %d, %s) first arrived after row %s (position %d, %s)",
					agg, a.id, pos, l.where[a.id], lastID[agg], p, l.where[lastID[agg]])
			}
			continue
		}
		last[agg], lastID[agg] = pos, a.id
	}
	for id, n := range dead {
		v.deadTotal++
		switch {
		case l.poison[id]:
			v.deadPoison++
		case l.rolledBack[id]:
			t.Errorf("rolled-back row %s was dead-lettered", id)
			v.rolledBackPublished++
		default:
			if _, ok := l.pos[id]; !ok {
				t.Errorf("dead letter %s is in no transaction of the ledger", id)
			} else if v.deadOther++; v.deadOther <= 5 {
				t.Errorf("row %s was dead-lettered (%d times), but every injected fault is transient", id, n)
			}
		}
	}
	for id := range l.pos {
		if !first[id] && dead[id] == 0 {
			if v.lost++; v.lost <= 5 {
				t.Errorf("committed row %s of aggregate %s (position %d) neither arrived nor was dead-lettered", id, l.agg[id], l.pos[id])
			}
		}
	}
	for id := range l.poison {
		if first[id] {
			t.Errorf("poison row %s arrived", id)
		}
	}
	if v.lost > 0 || v.orderViolations > 0 {
		t.Errorf("%d committed rows lost, %d rows first arrived after a row committed later in their aggregate", v.lost, v.orderViolations)
	}
	return v
}

// checkTable checks the ledger against the outbox table itself: every row
// it counts as committed is there, none it counts as rolled back is.
func (l *ledger) checkTable(t *testing.T, url string) {
	t.Helper()
	conn := connectT(t, url)
	l.mu.Lock()
	committed := make([]string, 0, len(l.pos))
	for id := range l.pos {
		committed = append(committed, id)
	}
	var rolledBack []string
	for id := range l.rolledBack {
		rolledBack = append(rolledBack, id)
	}
	emitted := l.emitted
	l.mu.Unlock()
	var inTable, ghosts int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])", committed).Scan(&inTable); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])", rolledBack).Scan(&ghosts); err != nil {
		t.Fatal(err)
	}
	// Table-less messages are in the ledger but not in the table.
	if inTable != len(committed)-emitted || ghosts != 0 {
		t.Errorf("ledger disagrees with the table: %d of %d committed table rows in it, %d rolled-back rows in it",
			inTable, len(committed)-emitted, ghosts)
	}
}

// checkMinimums fails t unless the writers did at least what least asks.
func (l *ledger) checkMinimums(t *testing.T, least nemesisMin) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pos) < least.rows {
		t.Errorf("the writers committed %d rows, want at least %d: the run exercised too little", len(l.pos), least.rows)
	}
	if l.rollbacks < least.rollbacks {
		t.Errorf("the writers rolled back %d transactions, want at least %d", l.rollbacks, least.rollbacks)
	}
	if l.savepointRows < least.savepointRows {
		t.Errorf("the writers rolled back %d rows under savepoints, want at least %d", l.savepointRows, least.savepointRows)
	}
}

func (l *ledger) figures() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := fmt.Sprintf("rows committed %d in %d transactions (%d of 150-300 rows; %d table-less messages; %d poison rows), %d transactions rolled back, %d rows under rolled-back savepoints, %d transactions in doubt after a lost connection (looked up)",
		len(l.pos), l.commits, l.big, l.emitted, len(l.poison), l.rollbacks, l.savepointRows, l.inDoubt)
	if len(l.errs) > 0 {
		s += fmt.Sprintf(", e.g. %q", l.errs[0])
	}
	return s
}

// deadLetters counts the dead letters of each message id, and the
// messages parked behind a dead letter of their aggregate
// (relay.dead_letter_order: park), which are accounted for the same way.
func deadLetters(ctx context.Context, url string) (map[string]int, error) {
	conn, err := connectCtx(ctx, url, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT message_id, count(*) FROM (
		SELECT message_id FROM outboxrelay.dead_letters UNION ALL SELECT message_id FROM outboxrelay.parked) d
		GROUP BY message_id`)
	if err != nil {
		return nil, err
	}
	dead := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		dead[id] = n
	}
	return dead, rows.Err()
}

func formatCounts(m map[string]int) string {
	var parts []string
	total := 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		total += m[k]
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}

// relayRunner keeps one relay running, as an orchestrator would: it
// restarts a relay that exited on its own, and kill9 crashes it.
// Safe for concurrent use.
type relayRunner struct {
	t   *testing.T
	cfg string
	env []string

	mu      sync.Mutex
	cur     *proc
	procs   []*proc
	kills   int
	exits   []string // how each relay that ended on its own ended
	stopped bool
}

func newRelayRunner(e *env, env []string) *relayRunner {
	rr := &relayRunner{t: e.t, cfg: e.config(), env: env}
	e.t.Cleanup(func() {
		rr.mu.Lock()
		defer rr.mu.Unlock()
		if p := rr.cur; p != nil {
			select {
			case <-p.done:
			default:
				p.kill()
			}
		}
		if rr.t.Failed() || os.Getenv("OUTBOXRELAY_TEST_LOGS") != "" {
			for _, p := range rr.procs[max(0, len(rr.procs)-2):] {
				rr.t.Logf("relay output:\n%s", tail(p.out.String(), 60))
			}
		}
	})
	return rr
}

func (rr *relayRunner) start() {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.startLocked()
}

func (rr *relayRunner) startLocked() {
	cmd := exec.Command(relayBin, "run", "--config", rr.cfg)
	cmd.Env = append(cleanEnv(), rr.env...)
	p := &proc{t: rr.t, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		rr.t.Errorf("start the relay: %v", err)
		return
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	rr.cur = p
	rr.procs = append(rr.procs, p)
}

func (rr *relayRunner) current() *proc {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.cur
}

// kill9 crashes the relay and starts a new one after pause. It reports
// whether the relay was still running when killed.
func (rr *relayRunner) kill9(pause time.Duration) bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	running := true
	select {
	case <-rr.cur.done:
		running = false
	default:
	}
	rr.cur.kill()
	rr.kills++
	time.Sleep(pause)
	rr.startLocked()
	return running
}

// supervise restarts the relay when it exits on its own, until ctx is done.
func (rr *relayRunner) supervise(ctx context.Context) {
	for ctx.Err() == nil {
		sleepCtx(ctx, 100*time.Millisecond)
		rr.mu.Lock()
		p := rr.cur
		rr.mu.Unlock()
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		default:
			continue
		}
		lines := strings.Split(strings.TrimSpace(p.out.String()), "\n")
		streamed := strings.Contains(p.out.String(), `"streaming"`)
		rr.mu.Lock()
		rr.exits = append(rr.exits, fmt.Sprintf("%v after streaming=%t: %s", p.err, streamed, lines[len(lines)-1]))
		rr.mu.Unlock()
		sleepCtx(ctx, 500*time.Millisecond) // an orchestrator's restart delay
		rr.mu.Lock()
		if !rr.stopped && rr.cur == p {
			rr.startLocked()
		}
		rr.mu.Unlock()
	}
}

// stop sends SIGTERM to the relay and requires a clean exit.
func (rr *relayRunner) stop() {
	rr.mu.Lock()
	rr.stopped = true
	p := rr.cur
	rr.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		rr.t.Errorf("relay did not stop within 60s after SIGTERM\n%s", tail(p.out.String(), 40))
		return
	}
	if p.err != nil {
		rr.t.Errorf("relay exited with %v after SIGTERM\n%s", p.err, tail(p.out.String(), 40))
	}
}

// figures counts starts, crashes, exits and logged retries over all relays.
func (rr *relayRunner) figures() string {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	retries, nacks := 0, 0
	for _, p := range rr.procs {
		out := p.out.String()
		retries += strings.Count(out, "publish failed; retrying")
		nacks += strings.Count(out, "nacked the message")
	}
	s := fmt.Sprintf("started %d times, killed %d, exited on its own %d; retries logged %d (%d of them nacks)",
		len(rr.procs), rr.kills, len(rr.exits), retries, nacks)
	for i, e := range rr.exits {
		if i == 3 {
			s += fmt.Sprintf("; %d more", len(rr.exits)-3)
			break
		}
		s += "; exit: " + e
	}
	return s
}
