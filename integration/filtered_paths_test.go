package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDroppedRowsCountedInEveryPath: a row that unmatched: drop drops is
// counted once in every path that reads rows: the first start's backfill
// of rows committed before the relay first ran and the live stream, in
// outboxrelay_messages_filtered_total{route="unmatched"} (backfill + live,
// each once), and `replay` and `recover`, which say how many rows they did
// not publish for the rules. The routed rows all arrive, once each, in
// order; no dropped row reaches the broker.
func TestDroppedRowsCountedInEveryPath(t *testing.T) {
	// migrate makes no slot: the rows committed before the first start are
	// the backfill's.
	e := newEnvOwner(t, "")
	ctx := t.Context()
	insert := func(aggType, aggID string, n int) []string {
		var ids []string
		for i := 0; i < n; i++ {
			var id string
			if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, $2, $1 || '.logged', '{}') RETURNING id::text`, aggType, aggID).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	// Before the first start: the backfill reads these from the table.
	orders := insert("order", "o1", 3)
	dropped := insert("audit", "a1", 2)
	cfgText := e.configText() + `
routes:
  - name: orders
    when: 'aggregate_type == "order"'
    destination: routed.orders
unmatched: drop
`
	cfg := e.writeConfig(cfgText)
	c := e.consume("routed.orders")
	p := e.startConfig(cfgText)
	p.waitLog(`"streaming"`, 30*time.Second)
	// Live: the stream reads these.
	orders = append(orders, insert("order", "o1", 2)...)
	dropped = append(dropped, insert("audit", "a1", 3)...)
	var endLSN string
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&endLSN); err != nil {
		t.Fatal(err)
	}
	c.waitIDs(orders, 60*time.Second)
	past := e.waitSlotPast(endLSN, 20*time.Second)
	_, metrics := get(t, "http://"+p.httpAddr()+"/metrics")
	p.stop()
	filtered := metricValues(metrics, "outboxrelay_messages_filtered_total")[`{route="unmatched",slot="outboxrelay"}`]

	recs := c.records()
	var got []delivered
	isDropped := map[string]bool{}
	for _, id := range dropped {
		isDropped[id] = true
	}
	for _, r := range recs {
		if isDropped[r.Headers["message_id"]] {
			t.Errorf("dropped row %s reached the broker", r.Headers["message_id"])
		}
		got = append(got, delivered{id: r.Headers["message_id"], key: r.Key, env: r.Env})
	}
	checkCommitOrder(t, map[string][]string{"o1": orders}, got)
	if d := duplicates(recs); d > 0 || len(recs) != len(orders) {
		t.Errorf("%d records, %d duplicates; want the %d routed rows once each", len(recs), d, len(orders))
	}
	if !past {
		t.Errorf("the slot was not confirmed past the dropped rows at %s (at %s)", endLSN, e.slotLSN())
	}
	// 2 rows dropped by the backfill, 3 by the stream, each once.
	if filtered != float64(len(dropped)) {
		t.Errorf(`outboxrelay_messages_filtered_total{route="unmatched"} = %v, want %d (2 from the first start's backfill, 3 from the stream)`, filtered, len(dropped))
	}

	total := len(orders) + len(dropped)
	replayOut, code := e.cli("replay", "--config", cfg, "--since", "1h")
	if want := fmt.Sprintf("replayed %d of %d messages\n%d rows dropped by the routing rules (unmatched: drop), not published\n", len(orders), total, len(dropped)); code != 0 || !strings.Contains(replayOut, want) {
		t.Errorf("replay exit %d:\n%s\nwant it to say %q", code, replayOut, want)
	}
	recoverOut, code := e.cli("recover", "--config", cfg, "--since", "1h", "--force")
	if want := fmt.Sprintf("republished %d messages;", len(orders)); code != 0 || !strings.Contains(recoverOut, want) ||
		!strings.Contains(recoverOut, fmt.Sprintf("\n%d rows dropped by the routing rules (unmatched: drop), not published\n", len(dropped))) {
		t.Errorf("recover exit %d:\n%s\nwant %d republished and %d dropped", code, recoverOut, len(orders), len(dropped))
	}
	t.Logf("dropped rows: %d routed delivered once each, filtered metric %v (backfill 2 + live 3); replay and recover each said %d dropped",
		len(orders), filtered, len(dropped))
}
