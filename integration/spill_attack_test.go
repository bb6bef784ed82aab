package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
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
