package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// loader commits rows to one database from a goroutine of its own, a
// transaction of five rows (one aggregate of three) every interval, until
// stopped, and keeps the ids as the ledger.
type loader struct {
	mu     sync.Mutex
	ids    []string
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func startLoader(t *testing.T, url, name string, every time.Duration) *loader {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &loader{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer conn.Close(context.Background())
		for i := 0; ctx.Err() == nil; i++ {
			rows, err := conn.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', $1, 'order.created', jsonb_build_object('seq', g) FROM generate_series(1, 5) g RETURNING id::text`,
				fmt.Sprintf("%s-%d", name, i%3))
			var ids []string
			if err == nil {
				ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil {
				if ctx.Err() == nil {
					l.mu.Lock()
					l.err = err
					l.mu.Unlock()
				}
				return
			}
			l.mu.Lock()
			l.ids = append(l.ids, ids...)
			l.mu.Unlock()
			time.Sleep(every)
		}
	}()
	t.Cleanup(l.stopNow)
	return l
}

func (l *loader) stopNow() {
	l.cancel()
	<-l.done
}

// stop ends the load and returns every id committed.
func (l *loader) stop(t *testing.T) []string {
	t.Helper()
	l.stopNow()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		t.Fatalf("load: %v", l.err)
	}
	return l.ids
}

func (l *loader) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// commitLSN is the newest source.commit_lsn of recs, as PostgreSQL writes it.
func maxCommitLSN(t *testing.T, db *pgx.Conn, recs []record) string {
	t.Helper()
	newest := "0/0"
	for _, r := range recs {
		src, _ := r.Env["source"].(map[string]any)
		lsn, _ := src["commit_lsn"].(string)
		if lsn == "" {
			t.Fatalf("a record without source.commit_lsn: %s", r.Value)
		}
		var later bool
		if err := db.QueryRow(t.Context(), "SELECT $1::pg_lsn > $2::pg_lsn", lsn, newest).Scan(&later); err != nil {
			t.Fatal(err)
		}
		if later {
			newest = lsn
		}
	}
	return newest
}

// TestPipelinesReload: under load on pipelines a and b, the configuration
// file is rewritten to hold a and c and the process gets SIGHUP: c starts,
// b drains and stops with its slot kept and its confirmed position past
// every row it delivered, and a is not restarted. An invalid file sent by
// SIGHUP is refused whole (one logged error, in /status) while delivery
// goes on. b, added back, delivers the rest: 0 lost on all three.
func TestPipelinesReload(t *testing.T) {
	envs := map[string]*env{}
	for _, name := range []string{"a", "b", "c"} {
		envs[name] = newEnvWith(t, serverFor(t), "", "--slot", "reload_"+name)
	}
	pipeline := func(name string) string {
		e := envs[name]
		return fmt.Sprintf(`  - name: %s
    postgres:
      url: %s
      slot: reload_%s
    sink:
      kafka:
        brokers: [%s]
`, name, e.dbURL, name, e.brokers)
	}
	head := "postgres:\n  status_interval: 200ms\nsink:\n  type: kafka\nhttp:\n  listen: 127.0.0.1:0\npipelines:\n"
	path := envs["a"].writeConfig(head + pipeline("a") + pipeline("b"))
	rewrite := func(text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := envs["a"].startCmd(relayCommand(path))
	base := "http://" + p.httpAddr()
	waitReady(t, base+"/readyz", 200, 60*time.Second)
	consumers := map[string]*consumer{}
	loads := map[string]*loader{}
	for name, e := range envs {
		consumers[name] = e.consume("outbox.order")
		loads[name] = startLoader(t, e.dbURL, name, 20*time.Millisecond) // c's rows wait in its slot until it is added
	}
	waitRows := func(name string, n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for len(consumers[name].records()) < n {
			if time.Now().After(deadline) {
				t.Fatalf("pipeline %s delivered %d records, want at least %d", name, len(consumers[name].records()), n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitRows("a", 200)
	waitRows("b", 200)

	// Remove b, add c.
	rewrite(head + pipeline("a") + pipeline("c"))
	hangup(t, p)
	p.waitLog(`"msg":"configuration reloaded"`, 60*time.Second)
	var active bool
	var confirmed string
	bEnv := envs["b"]
	if err := bEnv.db.QueryRow(t.Context(), "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'reload_b'").Scan(&active, &confirmed); err != nil {
		t.Fatalf("b's slot after its removal: %v", err)
	}
	if active {
		t.Errorf("b's slot is still active after the reload that removed b")
	}
	bDelivered := consumers["b"].records()
	newest := maxCommitLSN(t, bEnv.db, bDelivered)
	var past bool
	if err := bEnv.db.QueryRow(t.Context(), "SELECT $1::pg_lsn > $2::pg_lsn", confirmed, newest).Scan(&past); err != nil {
		t.Fatal(err)
	}
	if !past {
		t.Errorf("b's slot confirmed %s, not past the commit %s of the last row it delivered", confirmed, newest)
	}
	t.Logf("b removed: %d records delivered, newest commit %s, slot confirmed %s, %d rows committed so far", len(bDelivered), newest, confirmed, loads["b"].count())
	cBefore := len(consumers["c"].records())
	waitRows("c", cBefore+200)
	aNow := len(consumers["a"].records())
	time.Sleep(time.Second)
	if n := len(consumers["b"].records()); n != len(bDelivered) {
		t.Errorf("%d records of b arrived after its removal", n-len(bDelivered))
	}

	// An invalid file is refused whole; a and c go on.
	rewrite(head + pipeline("a") + pipeline("c") + "  - name: Bad Name\n    postgres: {slot: x}\n")
	hangup(t, p)
	p.waitLog(`"msg":"configuration reload refused; the running pipelines go on unchanged"`, 30*time.Second)
	if code, body := get(t, base+"/status"); code != 200 || !strings.Contains(body, `"reload":{`) || !strings.Contains(body, `"error":"invalid configuration`) {
		t.Errorf("/status after a refused reload: %d %s", code, body)
	}
	waitRows("a", aNow+200)
	waitRows("c", len(consumers["c"].records())+200)
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz after a refused reload: %d %q", code, body)
	}

	// b comes back and delivers what it had not: nothing is lost anywhere.
	ledgers := map[string][]string{}
	for name, l := range loads {
		ledgers[name] = l.stop(t)
	}
	rewrite(head + pipeline("a") + pipeline("b") + pipeline("c"))
	hangup(t, p)
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(p.out.String(), `"msg":"configuration reloaded"`) < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, name := range []string{"a", "b", "c"} {
		consumers[name].waitIDs(ledgers[name], 60*time.Second)
	}
	time.Sleep(500 * time.Millisecond) // a copy would come right behind the first
	for _, name := range []string{"a", "b", "c"} {
		recs := consumers[name].records()
		checkOnce(t, "pipeline "+name+" across reloads", ledgers[name], recs)
		t.Logf("pipeline %s: rows %d, lost 0, duplicates %d", name, len(ledgers[name]), duplicates(recs))
	}
	for labels, v := range republishedSeries(t, p.httpAddr()) {
		if v != 0 {
			t.Errorf("outboxrelay_messages_republished_total%s = %v across reloads, want 0", labels, v)
		}
	}
	p.stop()
	for name, e := range envs {
		if total, reasons := statusRepublished(t, e, "reload_"+name); total != 0 {
			t.Errorf("pipeline %s: status republished_total = %d %v, want 0", name, total, reasons)
		}
	}
	out := p.out.String()
	if n := strings.Count(out, `"msg":"configuration reload refused`); n != 1 {
		t.Errorf("%d refusal lines, want 1", n)
	}
	if n := countLines(out, `"pipeline":"a"`, `"msg":"streaming"`); n != 1 {
		t.Errorf("pipeline a started streaming %d times; the reloads should have left it alone", n)
	}
}

// relayCommand is `outboxrelay run --config path`.
func relayCommand(path string) *exec.Cmd {
	cmd := exec.Command(relayBin, "run", "--config", path)
	cmd.Env = cleanEnv()
	return cmd
}

// hangup sends SIGHUP to the relay.
func hangup(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// countLines counts the lines of out that contain every one of parts.
func countLines(out string, parts ...string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, s := range parts {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}
