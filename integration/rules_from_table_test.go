package integration

import (
	"fmt"
	"strings"
	"testing"
)

// TestRulesTestFromTable: `outboxrelay rules test --from-table N` dry-runs
// the configuration's rules on the newest N rows of its outbox table, read
// with the relay's own column mapping. Rows of three aggregate types, one
// that unmatched: drop drops, one whose rule fails on it at run time, one
// the relay dead-letters before any rule (an empty event type), and an
// older row past N that must not be shown. Nothing is written: the slot's
// confirmed position, the outbox and the dead letters are as they were.
// The wrong uses are one clear error each.
func TestRulesTestFromTable(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.db.Exec(ctx, `ALTER TABLE outbox ADD COLUMN region text`); err != nil {
		t.Fatal(err)
	}
	// Oldest first; created_at decides which rows are the newest.
	rows := []struct{ aggType, aggID, event, payload, region string }{
		{"order", "o-0", "order.created", `{"total": 1}`, "eu"}, // older than the newest 6
		{"order", "o-1", "order.created", `{"total": 250}`, "eu"},
		{"payment", "p-1", "payment.made", `{"amount": 12.5}`, "us"},
		{"audit", "a-1", "audit.logged", `{"who": "x"}`, "eu"},
		{"payment", "p-2", "payment.made", `{"currency": "EUR"}`, "us"},
		{"shipment", "s-1", "shipment.sent", `{}`, "eu"},
		{"order", "o-2", "", `{}`, "eu"},
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, region, created_at)
			VALUES ($1, $2, $3, $4::jsonb, $5, now() - make_interval(mins => $6)) RETURNING id::text`,
			r.aggType, r.aggID, r.event, r.payload, r.region, len(rows)-i).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	cfgText := e.configText() + `
routes:
  - name: orders
    when: 'aggregate_type == "order"'
    destination: 'outbox.{aggregate_type}'
  - name: payments
    when: 'event_type == "payment.made" && payload.amount > 0.0'
    destination: payments
    key: 'row["region"] + "/" + aggregate_id'
    headers: {x-region: 'row["region"]'}
  - name: shipments
    when: 'aggregate_type == "shipment"'
    destination: shipments
unmatched: drop
`
	cfg := e.writeConfig(cfgText)
	var slotBefore string
	if err := e.db.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'outboxrelay'`).Scan(&slotBefore); err != nil {
		t.Fatal(err)
	}

	out, code := e.cli("rules", "test", "--config", cfg, "--from-table", "6")
	if code != 0 {
		t.Fatalf("rules test --from-table 6: exit %d: %s", code, out)
	}
	t.Logf("rules test --from-table 6:\n%s", out)
	want := fmt.Sprintf(`row 1 (public.outbox id %[1]s): route=orders destination="outbox.{aggregate_type}" key="o-1" headers={}
row 2 (public.outbox id %[2]s): route=payments destination="payments" key="us/p-1" headers={x-region=us}
row 3 (public.outbox id %[3]s): dropped (unmatched: drop)
row 4 (public.outbox id %[4]s): dead letter: rule routes[1] (payments).when: no such key: amount
row 5 (public.outbox id %[5]s): route=shipments destination="shipments" key="s-1" headers={}
row 6 (public.outbox id %[6]s): dead letter: column event_type is null or empty
`, ids[1], ids[2], ids[3], ids[4], ids[5], ids[6])
	if out != want {
		t.Errorf("rules test --from-table 6:\n%s\nwant:\n%s", out, want)
	}
	if strings.Contains(out, ids[0]) {
		t.Errorf("the oldest row %s, past the newest 6, is shown", ids[0])
	}

	// Read-only: nothing written, the slot not confirmed.
	var slotAfter string
	var outbox, dead int
	if err := e.db.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'outboxrelay'`).Scan(&slotAfter); err != nil {
		t.Fatal(err)
	}
	if err := e.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outboxrelay.dead_letters)`).Scan(&outbox, &dead); err != nil {
		t.Fatal(err)
	}
	if slotAfter != slotBefore || outbox != len(rows) || dead != 0 {
		t.Errorf("after the dry run: slot confirmed at %s (was %s), %d outbox rows (want %d), %d dead letters (want 0)", slotAfter, slotBefore, outbox, len(rows), dead)
	}

	rowsFile := e.writeConfig(`{"id": "1", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "x", "payload": {}}` + "\n")
	unreachable := e.writeConfig(strings.Replace(cfgText, e.dbURL, "postgres://outboxrelay@127.0.0.1:1/nope?connect_timeout=2", 1))
	missing := e.writeConfig(strings.Replace(cfgText, "postgres:\n", "postgres:\n  tables: [public.outbox, public.nope]\n", 1))
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"zero", []string{"--config", cfg, "--from-table", "0"}, 2, `--from-table "0": want a positive number of rows`},
		{"not a number", []string{"--config", cfg, "--from-table", "ten"}, 2, `--from-table "ten": want a positive number of rows`},
		{"negative", []string{"--config", cfg, "--from-table", "-3"}, 2, `--from-table "-3": want a positive number of rows`},
		{"both", []string{"--config", cfg, "--from-table", "5", rowsFile}, 2, "give either a file of rows"},
		{"no config", []string{"--from-table", "5"}, 2, "--from-table needs --config FILE"},
		{"unreachable", []string{"--config", unreachable, "--from-table", "5"}, 2, "cannot connect to PostgreSQL"},
		{"missing table", []string{"--config", missing, "--from-table", "5"}, 2, `"public.nope" does not exist`},
	} {
		out, code := e.cli(append([]string{"rules", "test"}, c.args...)...)
		if code != c.code || !strings.Contains(out, c.want) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
			t.Errorf("%s: exit %d, output %q; want exit %d and one line with %q", c.name, code, out, c.code, c.want)
		}
	}
}
