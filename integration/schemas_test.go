package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSchemaValidation: with relay.schemas.dir, a payload that matches its
// schema is published, one that does not (a row or a table-less message)
// is dead-lettered with the failing pointer and rule and never published,
// relay.schemas.missing: deadletter dead-letters an event type without a
// schema, and the messages of other aggregates after them all arrive, in
// order, once each.
func TestSchemaValidation(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	schema := `{"type": "object", "required": ["seq"], "properties": {"seq": {"type": "integer", "minimum": 1}}}`
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.extra = fmt.Sprintf("relay:\n  schemas:\n    dir: %s\n    missing: deadletter\n", dir)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	before := e.insert("outbox", "order", "1", 5)
	var wrongType, noSchema, emitted string
	e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '2', 'order.created', '{"seq": "one"}') RETURNING id::text`).Scan(&wrongType)
	e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '3', 'order.shipped', '{"seq": 1}') RETURNING id::text`).Scan(&noSchema)
	e.db.QueryRow(t.Context(), `SELECT id::text FROM (SELECT gen_random_uuid() AS id) g,
		LATERAL pg_logical_emit_message(true, 'outboxrelay', json_build_object('id', g.id, 'aggregate_type', 'order',
		'aggregate_id', '4', 'event_type', 'order.created', 'payload', json_build_object('seq', 0))::text)`).Scan(&emitted)
	after := e.insert("outbox", "order", "5", 5)
	afterSame := e.insert("outbox", "order", "1", 5)
	valid := append(append(before, after...), afterSame...)
	c.waitIDs(valid, 60*time.Second)

	var letters []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
		if code != 0 {
			t.Fatalf("dlq list exit %d: %s", code, out)
		}
		letters = nil
		if err := json.Unmarshal([]byte(out), &letters); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		if len(letters) >= 3 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	errs := map[string]string{}
	for _, l := range letters {
		errs[fmt.Sprint(l["message_id"])] = fmt.Sprint(l["error"])
	}
	for id, want := range map[string]string{
		wrongType: `payload does not match schema order.created v1: at "/seq", rule order.created/v1.json#/properties/seq/type: got string, want integer`,
		noSchema:  `no schema for event type "order.shipped" version 1: add order.shipped/v1.json to the schema folder, or set relay.schemas.missing: allow`,
		emitted:   `at "/seq", rule order.created/v1.json#/properties/seq/minimum`,
	} {
		if !strings.Contains(errs[id], want) {
			t.Errorf("dead letter of %s: error %q, want it to contain %q", id, errs[id], want)
		}
	}
	if len(letters) != 3 {
		t.Errorf("%d dead letters, want 3: %v", len(letters), letters)
	}

	// The ledger: every valid row once, in commit order per aggregate,
	// and no invalid one published.
	p.stop()
	recs := c.records()
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Headers["message_id"]]++
	}
	for _, id := range []string{wrongType, noSchema, emitted} {
		if seen[id] > 0 {
			t.Errorf("invalid message %s was published", id)
		}
	}
	if d := duplicates(recs); d > 0 {
		t.Errorf("%d duplicates", d)
	}
	pos := map[string]int{}
	for i, r := range recs {
		pos[r.Headers["message_id"]] = i
	}
	for _, agg := range [][]string{append(append([]string(nil), before...), afterSame...), after} {
		for i := 1; i < len(agg); i++ {
			if pos[agg[i-1]] > pos[agg[i]] {
				t.Fatalf("aggregate out of order: %s arrived after %s", agg[i-1], agg[i])
			}
		}
	}
	t.Logf("schemas: %d valid rows delivered once each, 3 invalid dead-lettered", len(valid))
}

// TestTransformedPayloadSchema: with relay.schemas.dir and transform.payload,
// the schema checks the payload the transform made, through the relay binary
// to Kafka. The rows' own payloads lack the field the schema requires and
// the transform adds it; one row's transform gives it a value the schema
// refuses. The ledger: every other row delivered once, in commit order per
// aggregate, with the transformed payload; that row in the dead letters
// with the schema's error naming the transform, and never published; 0 lost.
func TestTransformedPayloadSchema(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	schema := `{"type": "object", "required": ["cents"], "properties": {"cents": {"type": "integer", "minimum": 0}}}`
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.extra = fmt.Sprintf(`relay:
  schemas:
    dir: %s
routes:
  - name: all
transform:
  payload: {cents: 'int(payload.total * 100.0)'}
`, dir)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	ctx := t.Context()
	ledger := map[string][]string{} // by aggregate, commit order
	cents := map[string]float64{}
	insert := func(aggID string, total float64) string {
		var id string
		if err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'order.created', jsonb_build_object('total', $2::float8)) RETURNING id::text`, aggID, total).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for i := 0; i < 6; i++ {
		for _, agg := range []string{"o1", "o2"} {
			id := insert(agg, float64(i)+0.5)
			ledger[agg] = append(ledger[agg], id)
			cents[id] = float64(i)*100 + 50
		}
	}
	bad := insert("o3", -1)
	for _, agg := range []string{"o1", "o2"} {
		id := insert(agg, 9)
		ledger[agg] = append(ledger[agg], id)
		cents[id] = 900
	}
	var valid []string
	for _, ids := range ledger {
		valid = append(valid, ids...)
	}
	c.waitIDs(valid, 60*time.Second)

	var letters []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for len(letters) == 0 && time.Now().Before(deadline) {
		out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
		if code != 0 {
			t.Fatalf("dlq list exit %d: %s", code, out)
		}
		if err := json.Unmarshal([]byte(out), &letters); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.stop()
	if len(letters) != 1 || fmt.Sprint(letters[0]["message_id"]) != bad {
		t.Fatalf("dead letters %v, want one, of %s", letters, bad)
	}
	wantErr := `the payload transform.payload made: payload does not match schema order.created v1: at "/cents", rule order.created/v1.json#/properties/cents/minimum`
	if got := fmt.Sprint(letters[0]["error"]); !strings.Contains(got, wantErr) {
		t.Errorf("dead letter error %q, want it to contain %q", got, wantErr)
	}

	recs := c.records()
	var got []delivered
	lost := 0
	seen := map[string]bool{}
	for _, r := range recs {
		id := r.Headers["message_id"]
		seen[id] = true
		if id == bad {
			t.Errorf("the row whose transformed payload fails its schema was published")
			continue
		}
		payload, _ := r.Env["payload"].(map[string]any)
		if payload["cents"] != cents[id] {
			t.Errorf("record %s: payload %v, want cents %v from the transform", id, r.Env["payload"], cents[id])
		}
		got = append(got, delivered{id: id, key: r.Key, env: r.Env})
	}
	for _, id := range valid {
		if !seen[id] {
			lost++
		}
	}
	checkCommitOrder(t, ledger, got)
	if d := duplicates(recs); d > 0 || lost > 0 {
		t.Errorf("%d duplicates, %d lost", d, lost)
	}
	t.Logf("transformed payload schema: %d rows delivered, %d duplicates, 1 dead letter, %d lost", len(valid), duplicates(recs), lost)
}
