package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRulesTest(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "relay.yaml")
	rows := filepath.Join(dir, "rows.jsonl")
	if err := os.WriteFile(cfg, []byte(`
postgres:
  url: postgres://ignored
routes:
  - name: big
    when: 'event_type == "order.created" && payload.total > 100.0'
    destination: big-orders
    key: 'row["tenant"] + "/" + aggregate_id'
    headers: {x-size: '"big"'}
  - name: paid
    when: 'event_type == "order.paid"'
    destination: 'payments.{aggregate_type}'
unmatched: drop
transform:
  headers: {x-tenant: 'row["tenant"]'}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rows, []byte(`{"id": "1", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.created", "payload": {"total": 250}, "tenant": "acme"}
{"id": "2", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.paid", "payload": {}, "tenant": "acme"}
{"id": "3", "aggregate_type": "order", "aggregate_id": "o-2", "event_type": "order.shipped", "payload": {}, "tenant": "acme"}
{"id": "4", "aggregate_type": "order", "aggregate_id": "o-3", "event_type": "order.created", "payload": {}, "tenant": "acme"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := runMain([]string{"rules", "test", "--config", cfg, rows}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := `row 1 (id 1): route=big destination="big-orders" key="acme/o-1" headers={x-size=big, x-tenant=acme}
row 2 (id 2): route=paid destination="payments.{aggregate_type}" key="o-1" headers={x-tenant=acme}
row 3 (id 3): dropped (unmatched: drop)
row 4 (id 4): dead letter: rule routes[0] (big).when: no such key: total
`
	if stdout.String() != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout.String(), want)
	}

	// A typo is exit 2 naming the rule and the position.
	if err := os.WriteFile(cfg, []byte("routes:\n  - name: big\n    when: 'evnt_type == \"x\"'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	if code := runMain([]string{"rules", "test", "--config", cfg, rows}, &stdout, &stderr); code != exitUsage ||
		!strings.Contains(stderr.String(), "routes[0] (big).when:1:1") || !strings.Contains(stderr.String(), "evnt_type") {
		t.Errorf("typo: exit %d, stderr %s", code, stderr.String())
	}
}

// With relay.schemas, the dry run checks each routed row's payload, the
// one transform.payload made, against its schema, and shows a row that
// fails as the dead letter the relay makes of it.
func TestRulesTestChecksSchemas(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "schemas", "order.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	schema := `{"type": "object", "required": ["total", "cents"], "properties": {"cents": {"type": "integer"}}}`
	if err := os.WriteFile(filepath.Join(dir, "schemas", "order.created", "v1.json"), []byte(schema), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "relay.yaml")
	rows := filepath.Join(dir, "rows.jsonl")
	if err := os.WriteFile(cfg, []byte(`
relay:
  schemas:
    dir: `+filepath.Join(dir, "schemas")+`
    missing: deadletter
routes:
  - name: orders
    when: 'aggregate_type == "order"'
    destination: orders
transform:
  payload: {cents: 'payload.total * 100.0'}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rows, []byte(`{"id": "1", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.created", "payload": {"total": 12}}
{"id": "2", "aggregate_type": "order", "aggregate_id": "o-2", "event_type": "order.created", "payload": {"total": 12.345}}
{"id": "3", "aggregate_type": "order", "aggregate_id": "o-3", "event_type": "order.paid", "payload": {"total": 1}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := runMain([]string{"rules", "test", "--config", cfg, rows}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 4 ||
		lines[0] != `row 1 (id 1): route=orders destination="orders" key="o-1" headers={}` ||
		lines[1] != `row 1 (id 1): payload={"cents":1200,"total":12}` ||
		!strings.HasPrefix(lines[2], "row 2 (id 2): dead letter: the payload transform.payload made: ") || !strings.Contains(lines[2], "cents") ||
		!strings.HasPrefix(lines[3], "row 3 (id 3): dead letter: ") || !strings.Contains(lines[3], "relay.schemas.missing") {
		t.Errorf("stdout:\n%s\nwant row 1 routed with its payload, row 2 dead-lettered by its transformed payload's schema, row 3 by its missing schema", stdout.String())
	}
}
