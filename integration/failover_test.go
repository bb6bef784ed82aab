package integration

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// pair is a primary and a physical standby that streams from it through the
// physical slot "standby", with synchronous commit on the standby: a commit
// the primary acknowledged is on the standby too, so that whatever the
// relay misses after a failover is the relay's loss, not the database's.
type pair struct {
	primary, standby *pgserver.Server
	e                *env
}

// startPair starts PostgreSQL version as a primary, migrates a database on
// it (migrateArgs go to migrate) and makes a standby of it. With syncSlots
// (PostgreSQL 17+) the standby synchronizes failover slots and the primary
// lists it in synchronized_standby_slots.
func startPair(t *testing.T, version string, syncSlots bool, migrateArgs ...string) *pair {
	t.Helper()
	ctx := t.Context()
	primary := pgservertest.Start(t, pgserver.Options{Version: version})
	e := newEnvWith(t, primary, "", migrateArgs...)
	e.exec("SELECT pg_create_physical_replication_slot('standby', true)")

	settings := map[string]string{"hot_standby_feedback": "on"}
	if syncSlots {
		settings["sync_replication_slots"] = "on"
	}
	standby, err := primary.StartStandby(ctx, "standby", pgserver.Options{Logf: t.Logf, Settings: settings})
	if err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("standby log (last lines):\n%s", standby.LogTail(30))
		}
		if err := standby.Stop(); err != nil {
			t.Errorf("stop the standby: %v", err)
		}
	})
	admin := connectT(t, primary.URL("postgres"))
	// Set only now: the standby's copy must not wait for itself after its
	// promotion.
	alter := []string{"ALTER SYSTEM SET synchronous_standby_names = 'standby'"}
	if syncSlots {
		alter = append(alter, "ALTER SYSTEM SET synchronized_standby_slots = 'standby'")
	}
	for _, q := range append(alter, "SELECT pg_reload_conf()") {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	e.db.Close(ctx)
	if e.db, err = pgx.Connect(ctx, e.dbURL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the standby to stream from the primary", func() bool {
		var n int
		admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'").Scan(&n)
		return n == 1
	})
	return &pair{primary: primary, standby: standby, e: e}
}

// standbyURL is the test database on the standby.
func (p *pair) standbyURL() string {
	u, _ := url.Parse(p.e.dbURL)
	u.Host = fmt.Sprintf("127.0.0.1:%d", p.standby.Port())
	return u.String()
}

// failover kills the primary with SIGKILL and promotes the standby; it
// returns the time of the kill.
func (p *pair) failover(t *testing.T) time.Time {
	t.Helper()
	killed := time.Now()
	if err := p.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.standby.Promote(t.Context()); err != nil {
		t.Fatal(err)
	}
	return killed
}

// writer inserts rows on the primary until it fails or is stopped, and
// keeps the ids of the transactions whose commit was acknowledged.
type writer struct {
	mu    sync.Mutex
	acked []string
	done  chan struct{}
	stop  context.CancelFunc
}

func startWriter(t *testing.T, dbURL string) *writer {
	ctx, cancel := context.WithCancel(t.Context())
	w := &writer{done: make(chan struct{}), stop: cancel}
	go func() {
		defer close(w.done)
		for seq := 0; ctx.Err() == nil; seq++ {
			ids, err := insertOnce(ctx, dbURL, "outbox", "order", fmt.Sprint(seq%8), 10)
			if err != nil {
				return // the primary is gone: a commit in flight is unknown, not acked
			}
			w.mu.Lock()
			w.acked = append(w.acked, ids...)
			w.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return w
}

func (w *writer) wait() []string {
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked
}

// TestFailoverSlotFollowsPromotion: on PostgreSQL 17 with
// postgres.failover_slot, rows flow, the primary is killed with SIGKILL and
// the standby promoted; the relay, given both hosts, follows the new
// primary and every acknowledged row, and every row the new primary holds,
// arrives.
func TestFailoverSlotFollowsPromotion(t *testing.T) {
	p := startPair(t, "17", true, "--failover-slot")
	e := p.e
	standby := connectT(t, p.standbyURL())

	primaryURL := e.dbURL
	u, _ := url.Parse(e.dbURL)
	u.Host = fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", p.primary.Port(), p.standby.Port())
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	e.dbURL = u.String()

	c := e.consume("outbox.order")
	relay := e.start("OUTBOXRELAY_POSTGRES_FAILOVER_SLOT=true", "OUTBOXRELAY_POSTGRES_HEARTBEAT_INTERVAL=200ms")
	relay.waitLog(`"streaming"`, 30*time.Second)
	// The standby keeps its copy of the slot once the slot on the primary
	// has moved past where the standby started. The slot's restart_lsn moves
	// at running-transactions records, which PostgreSQL writes every 15 s;
	// pg_log_standby_snapshot writes one now.
	start := time.Now()
	waitFor(t, 60*time.Second, "the failover slot to be synchronized to the standby", func() bool {
		e.exec("SELECT pg_log_standby_snapshot()")
		var synced bool
		standby.QueryRow(t.Context(), "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'outboxrelay'").Scan(&synced)
		return synced
	})
	t.Logf("slot synchronized to the standby %s after the relay started", time.Since(start).Round(time.Millisecond))
	if st, code, out := e.statusJSON(); code != 0 || st.Failover == nil || !*st.Failover || st.Synced == nil || *st.Synced {
		t.Fatalf("status on the primary: exit %d, want failover true and synced false:\n%s", code, out)
	}
	w := startWriter(t, primaryURL)
	time.Sleep(2 * time.Second)

	killed := p.failover(t)
	acked := w.wait()
	promoted := time.Since(killed)

	// The first row written on the new primary.
	marker, err := insertOnce(t.Context(), p.standbyURL(), "outbox", "order", "after", 1)
	if err != nil {
		t.Fatal(err)
	}
	var firstPublish time.Duration
	waitFor(t, 90*time.Second, "the first row written on the new primary to arrive", func() bool {
		for _, r := range c.records() {
			if r.Headers["message_id"] == marker[0] {
				firstPublish = time.Since(killed)
				return true
			}
		}
		return false
	})
	after, err := insertOnce(t.Context(), p.standbyURL(), "outbox", "order", "after", 500)
	if err != nil {
		t.Fatal(err)
	}

	var onNewPrimary []string
	rows, err := standby.Query(t.Context(), "SELECT id::text FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	if onNewPrimary, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]string(nil), acked...), marker...), after...)
	c.waitIDs(want, 60*time.Second)
	recs := c.waitIDs(onNewPrimary, 30*time.Second)
	relay.stop()
	if st, code, out := e.statusJSON(); code != 0 || st.Failover == nil || !*st.Failover || st.Synced == nil || !*st.Synced {
		t.Fatalf("status on the new primary: exit %d, want failover and synced true:\n%s", code, out)
	}
	if len(acked) < 100 {
		t.Fatalf("only %d rows acknowledged before the kill; the test did not exercise a stream", len(acked))
	}
	t.Logf("failover on PostgreSQL 17: %d rows acknowledged before the kill, %d on the new primary, %d written after; lost 0, duplicates %d (records %d); promotion %s after the kill, first new publish %s after the kill",
		len(acked), len(onNewPrimary), len(after)+1, duplicates(recs), len(recs), promoted.Round(time.Millisecond), firstPublish.Round(time.Millisecond))
}

// TestFailoverWithoutFailoverSlot: when the slot did not follow the
// promotion (PostgreSQL 16, where slots never do), the relay on the new
// primary refuses with the lost-slot error instead of creating a fresh slot
// that would skip what it had not confirmed.
func TestFailoverWithoutFailoverSlot(t *testing.T) {
	p := startPair(t, "16", false)
	e := p.e
	c := e.consume("outbox.order")
	relay := e.start()
	relay.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 20)
	c.waitIDs(ids, 30*time.Second)
	time.Sleep(1500 * time.Millisecond) // let the checkpoint be recorded
	relay.stop()

	p.failover(t)
	e.dbURL = p.standbyURL()
	e.db.Close(context.Background())
	e.db = connectT(t, e.dbURL)
	e.insert("outbox", "order", "1", 5) // the new primary has no slot to keep these

	out, code := e.cli("run", "--config", e.config())
	if code != 2 || !strings.Contains(out, "does not exist on this server") || !strings.Contains(out, "timeline 2, so it was promoted") || !strings.Contains(out, "outboxrelay recover") {
		t.Fatalf("exit %d, want 2 with the lost-slot error:\n%s", code, out)
	}
	var slots int
	e.db.QueryRow(t.Context(), "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'").Scan(&slots)
	if slots != 0 {
		t.Fatalf("the relay created %d logical slot(s) on the new primary", slots)
	}
	t.Logf("relay on the promoted PostgreSQL 16 standby: %s", tail(strings.TrimSpace(out), 1))
}
