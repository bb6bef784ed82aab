package integration

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRoutingRulesKafka: `outboxrelay run` applies the routing rules of its
// configuration file, through the relay binary to Kafka (kfake). Rows of
// four event types: orders go to one topic, payments to another with a key
// from a column, audit rows match no route and unmatched: drop drops them,
// and one payment whose payload lacks the field its rule reads fails the
// rule at run time. Checked against the ledger of committed rows: every
// routed row on its route's topic and nowhere else, per-aggregate order, 0
// lost, no topic but the routes', the dropped rows counted in
// outboxrelay_messages_filtered_total and the slot confirmed past them, the
// failing row in the dead letters with the rule's error, `verify`
// reporting nothing missing, and `replay` republishing only routed rows.
func TestRoutingRulesKafka(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.db.Exec(ctx, `ALTER TABLE outbox ADD COLUMN region text`); err != nil {
		t.Fatal(err)
	}
	cfgText := e.configText() + `
routes:
  - name: orders
    when: 'aggregate_type == "order"'
    destination: routed.orders
  - name: payments
    when: 'event_type == "payment.made" && payload.amount > 0.0'
    destination: 'routed.{aggregate_type}'
    key: 'row["region"] + "/" + aggregate_id'
unmatched: drop
`
	cfg := e.writeConfig(cfgText)
	if out, code := e.cli("run", "--config", cfg, "--check-config"); code != 0 {
		t.Fatalf("run --check-config exit %d: %s", code, out)
	}
	bad := e.writeConfig(strings.Replace(cfgText, "aggregate_type == \"order\"", "aggregate_typ == \"order\"", 1))
	if out, code := e.cli("run", "--config", bad, "--check-config"); code == 0 || !strings.Contains(out, "routes[0] (orders).when") || !strings.Contains(out, "undeclared reference to 'aggregate_typ'") {
		t.Fatalf("a typo in a rule: exit %d: %s; want a failure naming routes[0] (orders).when", code, out)
	}
	p := e.startConfig(cfgText)
	p.waitLog(`"streaming"`, 30*time.Second)

	type row struct{ aggType, aggID, event, payload, region string }
	orders := map[string][]string{}   // by aggregate, commit order
	payments := map[string][]string{} // by aggregate, commit order
	topicOf := map[string]string{}
	keyOf := map[string]string{}
	var dropped []string
	insert := func(rs []row) []string {
		tx, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rs {
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, region)
				VALUES ($1, $2, $3, $4::jsonb, $5) RETURNING id::text`, r.aggType, r.aggID, r.event, r.payload, r.region).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	for i := 0; i < 8; i++ {
		rs := []row{
			{"order", fmt.Sprint("o", i%2), "order.created", fmt.Sprintf(`{"n":%d}`, i), "eu"},
			{"payment", fmt.Sprint("p", i%3), "payment.made", fmt.Sprintf(`{"amount":%d.5}`, i), "us"},
			{"audit", "a1", "audit.logged", `{"who":"x"}`, "eu"},
		}
		ids := insert(rs)
		orders[rs[0].aggID] = append(orders[rs[0].aggID], ids[0])
		topicOf[ids[0]], keyOf[ids[0]] = "routed.orders", rs[0].aggID
		payments[rs[1].aggID] = append(payments[rs[1].aggID], ids[1])
		topicOf[ids[1]], keyOf[ids[1]] = "routed.payment", "us/"+rs[1].aggID
		dropped = append(dropped, ids[2])
	}
	// A payment whose payload lacks amount: its rule fails on it.
	failing := insert([]row{{"payment", "p9", "payment.made", `{"currency":"EUR"}`, "us"}})[0]
	// Dropped rows last: the slot must be confirmed past them.
	dropped = append(dropped, insert([]row{{"audit", "a2", "audit.logged", `{}`, "eu"}, {"audit", "a2", "audit.logged", `{}`, "eu"}})...)
	var endLSN string
	if err := e.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&endLSN); err != nil {
		t.Fatal(err)
	}

	got := map[string][]delivered{}
	lost := 0
	for _, topic := range []string{"routed.orders", "routed.payment"} {
		want := 0
		for _, tp := range topicOf {
			if tp == topic {
				want++
			}
		}
		recs := e.rawRecords(topic, want)
		if len(recs) < want {
			lost += want - len(recs)
		}
		for _, r := range recs {
			id := header(r, "message_id")
			if topicOf[id] != topic {
				t.Errorf("record %s on %s, want it on %q by the rules", id, topic, topicOf[id])
			}
			if string(r.Key) != keyOf[id] {
				t.Errorf("record %s: key %q, want %q", id, r.Key, keyOf[id])
			}
			var env map[string]any
			if err := json.Unmarshal(r.Value, &env); err != nil {
				t.Fatalf("record %s: %v", id, err)
			}
			got[topic] = append(got[topic], delivered{id: id, key: string(r.Key), env: env})
		}
	}
	checkCommitOrder(t, orders, got["routed.orders"])
	checkCommitOrder(t, payments, got["routed.payment"])

	// The slot is confirmed past the dropped rows at the end.
	past := e.waitSlotPast(endLSN, 20*time.Second)
	_, metrics := get(t, "http://"+p.httpAddr()+"/metrics")
	p.stop()
	filtered := metricValues(metrics, "outboxrelay_messages_filtered_total")[`{route="unmatched",slot="outboxrelay"}`]

	// A replay of the window publishes the routed rows again, to their
	// routes' topics, and never a dropped one; the row whose rule fails is
	// refused again with the rule's error (exit 1).
	replayOut, replayCode := e.cli("replay", "--config", cfg, "--since", "1h")
	t.Logf("replay exit %d: %s", replayCode, replayOut)
	if replayCode != 1 || !strings.Contains(replayOut, fmt.Sprintf("replayed %d of ", len(topicOf))) || !strings.Contains(replayOut, "no such key: amount") {
		t.Errorf("replay exit %d: %s; want the %d routed rows replayed", replayCode, replayOut, len(topicOf))
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tds, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for _, name := range tds.Names() {
		if !strings.HasPrefix(name, "__") && !strings.Contains(name, "positions") {
			topics = append(topics, name)
		}
	}
	sort.Strings(topics)

	var deadID, deadErr string
	var dead int
	if err := e.db.QueryRow(ctx, `SELECT count(*), max(message_id), max(error) FROM outboxrelay.dead_letters`).Scan(&dead, &deadID, &deadErr); err != nil {
		t.Fatal(err)
	}
	verifyOut, verifyCode := e.cli("verify", "--config", cfg, "--since", "1h")
	t.Logf("rows %d routed (%d orders, %d payments) + %d dropped + 1 failing rule: lost %d, filtered metric %v, dead letters %d, topics %v, slot past the dropped rows %v; verify exit %d:\n%s",
		len(topicOf), len(got["routed.orders"]), len(got["routed.payment"]), len(dropped), lost, filtered, dead, topics, past, verifyCode, verifyOut)
	if lost != 0 {
		t.Errorf("%d routed rows lost", lost)
	}
	if want := []string{"routed.orders", "routed.payment"}; strings.Join(topics, ",") != strings.Join(want, ",") {
		t.Errorf("topics %v, want only the routes' %v (dropped rows reach no topic)", topics, want)
	}
	if filtered != float64(len(dropped)) {
		t.Errorf("outboxrelay_messages_filtered_total{route=\"unmatched\"} = %v, want %d", filtered, len(dropped))
	}
	if !past {
		t.Errorf("the slot was not confirmed past the dropped rows at %s (at %s)", endLSN, e.slotLSN())
	}
	if dead != 1 || deadID != failing || !strings.Contains(deadErr, "rule routes[1] (payments).when") || !strings.Contains(deadErr, "no such key: amount") {
		t.Errorf("dead letters: %d, %s %q; want 1, the failing row %s with its rule's error", dead, deadID, deadErr, failing)
	}
	if verifyCode != 0 || !strings.Contains(verifyOut, "missing        0\n") || !strings.Contains(verifyOut, fmt.Sprintf("filtered       %d\n", len(dropped))) ||
		!strings.Contains(verifyOut, "dead-lettered  1\n") {
		t.Errorf("verify exit %d:\n%s\nwant nothing missing, %d filtered, 1 dead-lettered", verifyCode, verifyOut, len(dropped))
	}
}
