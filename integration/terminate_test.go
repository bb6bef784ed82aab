package integration

import (
	"strings"
	"testing"
	"time"
)

// TestTerminatedCheckpointConnection: pg_terminate_backend of the relay's
// regular sessions, among them the one that records the checkpoint, while
// rows flow (SQLSTATE 57P01, which poolers, admins and session-killing
// monitors send) is not a PostgreSQL shutdown. The relay records on a new
// connection and never confirms past its record, so a kill -9 right after
// leaves a relay that starts again, without a false "re-created" refusal,
// and delivers every row.
func TestTerminatedCheckpointConnection(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	wait := e.insertLoop(300, 20, 10*time.Millisecond)

	// Terminate the relay's sessions a few times; after each, watch for the
	// slot passing the record, the state a crash must not find.
	terminated, ahead := 0, ""
	for round := 0; round < 10 && ahead == ""; round++ {
		time.Sleep(300 * time.Millisecond)
		var n int
		if err := e.db.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND application_name = 'outboxrelay'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		terminated += n
		for deadline := time.Now().Add(time.Second); ahead == "" && time.Now().Before(deadline); {
			ahead = e.slotAheadOfRecord()
		}
	}
	p.kill()
	var hit int // checkpoint writes that met a terminated session
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "checkpoint") && strings.Contains(line, "57P01") {
			hit++
		}
	}
	if terminated == 0 || hit == 0 {
		t.Fatalf("terminated %d sessions, %d checkpoint writes failed with 57P01: the fault was not exercised", terminated, hit)
	}
	if ahead != "" {
		t.Errorf("the slot passed the recorded checkpoint after a terminated session, with PostgreSQL running: %s", ahead)
	}

	p = e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := wait()
	recs := c.waitIDs(ids, 120*time.Second)
	p.stop()
	t.Logf("terminated sessions %d (checkpoint writes hit %d), then kill -9: rows %d, lost 0, duplicates %d (records %d)",
		terminated, hit, len(ids), duplicates(recs), len(recs))
	if len(ids) != 6000 {
		t.Fatalf("inserted %d rows, want 6000", len(ids))
	}
}

// slotAheadOfRecord describes the slot's confirmed_flush_lsn being past the
// relay's recorded checkpoint, or returns "". The slot is read first: the
// record only grows, so a record read later that is still behind the slot
// was behind it at that moment too.
func (e *env) slotAheadOfRecord() string {
	e.t.Helper()
	slot := e.slotLSN()
	if slot == "" {
		return ""
	}
	var rec string
	var behind bool
	err := e.db.QueryRow(e.t.Context(), `SELECT coalesce(confirmed_lsn, '0/0')::text, coalesce(confirmed_lsn, '0/0') < $1::pg_lsn FROM outboxrelay.checkpoint WHERE slot = 'outboxrelay'`, slot).Scan(&rec, &behind)
	if err != nil {
		e.t.Fatal(err)
	}
	if !behind {
		return ""
	}
	return "slot at " + slot + ", record at " + rec
}
