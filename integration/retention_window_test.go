package integration

import (
	"strings"
	"testing"
	"time"
)

// TestVerifyPastRetention: rows committed 3 h ago, which retention (1 h)
// has deleted, and rows committed 10 min ago all reached Kafka. A verify
// window from 4 h ago must not report the retained rows as the whole
// window with exit 0: it names the part it cannot vouch for and exits 1,
// unless --allow-uncovered; a window within the retention exits 0.
func TestVerifyPastRetention(t *testing.T) {
	e := newEnv(t)
	var old, recent int
	e.exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', (g % 4)::text, 'order.created', jsonb_build_object('seq', g), now() - interval '3 hours' FROM generate_series(1, 193) g`)
	ids := e.insert("outbox", "order", "9", 390)
	cfg := strings.Replace(e.configText(), "postgres:\n", "postgres:\n  retention: 1h\n", 1)
	c := e.consume("outbox.order")
	p := e.startConfig(cfg)
	p.waitLog(`"streaming"`, 30*time.Second)
	recs := c.waitIDs(ids, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := e.db.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE created_at < now() - interval '1 hour'), count(*) FILTER (WHERE created_at >= now() - interval '1 hour') FROM outbox`).Scan(&old, &recent); err != nil {
			t.Fatal(err)
		}
		if old == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention left %d rows older than 1h", old)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for len(c.records()) < 193+390 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	p.stop()
	if n := len(c.records()); n < 193+390 || recent != 390 {
		t.Fatalf("delivered %d records, %d rows retained; want all 583 delivered and 390 retained", n, recent)
	}

	path := e.writeConfig(cfg)
	out, code := e.cli("verify", "--config", path, "--since", "4h")
	if code != 1 || !strings.Contains(out, "committed      390") || !strings.Contains(out, "not covered") ||
		!strings.Contains(out, "(75%) lies past postgres.retention (1h0m0s)") || !strings.Contains(out, "--allow-uncovered") {
		t.Fatalf("verify --since 4h exited %d, want 1 naming the 3 h not covered:\n%s", code, out)
	}
	t.Logf("verify --since 4h over 583 committed, 193 deleted by retention: exit %d\n%s", code, out)
	if out, code := e.cli("verify", "--config", path, "--since", "4h", "--allow-uncovered"); code != 0 || !strings.Contains(out, "not covered") {
		t.Fatalf("verify --allow-uncovered exited %d, want 0 still naming the uncovered part:\n%s", code, out)
	}
	if out, code := e.cli("verify", "--config", path, "--since", "50m"); code != 0 || strings.Contains(out, "not covered") || !strings.Contains(out, "missing        0") {
		t.Fatalf("verify within the retention exited %d, want 0:\n%s", code, out)
	}
	t.Logf("committed %d, delivered %d, duplicates %d", 193+390, len(c.records()), duplicates(recs))
}

// TestMaintainTrimsDefaultPartition: in a `migrate --partitioned` outbox,
// rows that fell into the default partition are deleted once older than
// postgres.retention, like the daily partitions that are dropped; newer
// ones stay.
func TestMaintainTrimsDefaultPartition(t *testing.T) {
	e := newEnvWith(t, pg, "", "--partitioned")
	e.exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', '1', 'order.created', '{}', '2000-01-01T12:00:00Z' FROM generate_series(1, 120)`)
	e.exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', '1', 'order.created', '{}', now() + interval '60 days' FROM generate_series(1, 7)`)
	count := func() (old, kept int) {
		t.Helper()
		if err := e.db.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE created_at < '2001-01-01'), count(*) FILTER (WHERE created_at > now())
			FROM outbox_default`).Scan(&old, &kept); err != nil {
			t.Fatal(err)
		}
		return old, kept
	}
	if old, kept := count(); old != 120 || kept != 7 {
		t.Fatalf("default partition holds %d old and %d future rows, want 120 and 7", old, kept)
	}
	cfg := strings.Replace(e.configText(), "postgres:\n", "postgres:\n  retention: 720h\n", 1)
	out, code := e.cli("maintain", "--config", e.writeConfig(cfg))
	if code != 0 || !strings.Contains(out, "deleted 120 rows created before") || !strings.Contains(out, "from the default partition public.outbox_default") {
		t.Fatalf("maintain exited %d, want 0 deleting the 120 old rows of the default partition:\n%s", code, out)
	}
	if old, kept := count(); old != 0 || kept != 7 {
		t.Fatalf("after maintain the default partition holds %d old and %d future rows, want 0 and 7", old, kept)
	}
	t.Logf("maintain: %s", strings.TrimSpace(out))
}
