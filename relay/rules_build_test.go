package relay_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
	"github.com/outboxrelay/outboxrelay/relay"
)

// TestBuildAppliesRules: the builder makes a row's messages as the rules
// say: a route's destination, key (from a column), headers and format, the
// transform's payload field, one message per route with continue, a
// filtered message for unmatched: drop, and a rule failing on the row is
// the row's error, naming the rule.
func TestBuildAppliesRules(t *testing.T) {
	cfg := relay.Config{Tables: []string{"public.outbox"}, Rules: rules.Config{
		Routes: []rules.Route{
			{Name: "all", When: `row["tenant"] == "acme"`, Destination: "audit", Continue: true},
			{Name: "orders", When: `aggregate_type == "order" && payload.n > 1`, Destination: "orders.{event_type}",
				Key: `row["tenant"] + "/" + aggregate_id`, Headers: map[string]string{"x-tenant": `row["tenant"]`}, Format: "debezium"},
		},
		Unmatched: rules.UnmatchedDrop,
		Transform: rules.Transform{Payload: map[string]string{"routed": "true"}},
	}}
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	b := relay.NewBuilder(cfg, relay.Options{})
	tx := cdc.Begin{FinalLSN: 0x200, XID: 9, CommitTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	build := func(payload, tenant string) ([]*relay.Message, error) {
		return b.Rows(context.Background(), optionsRelation, optionsRow([]byte(payload), []byte(tenant), nil), tx)
	}

	ms, err := build(`{"n":2}`, "acme")
	if err != nil || len(ms) != 2 {
		t.Fatalf("two routes: %d messages, %v", len(ms), err)
	}
	audit, order := ms[0], ms[1]
	if audit.Route != "all" || audit.RouteDestination != "audit" || audit.Key != "o-1" || audit.Format != relay.FormatEnvelope {
		t.Errorf("audit message: route %q destination %q key %q format %q", audit.Route, audit.RouteDestination, audit.Key, audit.Format)
	}
	var env map[string]any
	if err := json.Unmarshal(audit.Envelope, &env); err != nil || env["payload"].(map[string]any)["routed"] != true {
		t.Errorf("audit envelope %s (%v): want the transformed payload", audit.Envelope, err)
	}
	if order.Route != "orders" || order.RouteDestination != "orders.{event_type}" || order.Key != "acme/o-1" || order.Format != relay.FormatDebezium {
		t.Errorf("order message: route %q destination %q key %q format %q", order.Route, order.RouteDestination, order.Key, order.Format)
	}
	if string(order.Envelope) != `{"n":2,"routed":true}` {
		t.Errorf("debezium body %s, want the transformed payload", order.Envelope)
	}
	if h := order.Headers; len(h) != 1 || h[0] != (envelope.Header{Key: "x-tenant", Value: "acme"}) {
		t.Errorf("order headers %v, want x-tenant: acme", h)
	}

	ms, err = build(`{"n":0}`, "other")
	if err != nil || len(ms) != 1 || ms[0].Filtered != relay.FilteredUnmatched {
		t.Fatalf("unmatched row: %+v, %v; want one message filtered as unmatched", ms, err)
	}

	_, err = build(`{"m":1}`, "other")
	if err == nil || !strings.Contains(err.Error(), "rule routes[1] (orders).when") || !strings.Contains(err.Error(), "no such key: n") {
		t.Fatalf("a rule failing on the row: %v", err)
	}
	// The next row is routed as before.
	if ms, err := build(`{"n":5}`, "other"); err != nil || len(ms) != 1 || ms[0].Route != "orders" {
		t.Fatalf("after a failing row: %d messages, %v", len(ms), err)
	}
}

// TestTransformedPayloadIsValidated: with a schema folder, the payload that
// is checked is the one transform.payload made, not the row's: a row whose
// own payload matches but whose transformed one does not is the row's error,
// the schema's, saying the transform made it; a row whose own payload does
// not match but whose transformed one does is built without one.
func TestTransformedPayloadIsValidated(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "OrderPlaced"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "OrderPlaced", "v1.json"),
		[]byte(`{"type": "object", "required": ["cents"], "properties": {"cents": {"type": "integer"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := schema.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{Tables: []string{"public.outbox"}, Rules: rules.Config{
		Routes:    []rules.Route{{Name: "all", Destination: "orders"}},
		Transform: rules.Transform{Payload: map[string]string{"cents": `payload.total * 100.0`}},
	}}
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	b := relay.NewBuilder(cfg, relay.Options{Validator: relay.ValidateFunc(func(em *envelope.Message) error {
		return set.Validate(em.EventType, em.SchemaVersion, em.Payload)
	})})
	tx := cdc.Begin{FinalLSN: 0x200, XID: 9, CommitTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	build := func(payload string) ([]*relay.Message, error) {
		return b.Rows(context.Background(), optionsRelation, optionsRow([]byte(payload), []byte("acme"), nil), tx)
	}
	// The row's own payload has an integer cents; the transform makes it 250.5.
	ms, err := build(`{"total": 2.505, "cents": 3}`)
	if err == nil || len(ms) != 1 || !strings.Contains(err.Error(), "the payload transform.payload made") ||
		!strings.Contains(err.Error(), "payload does not match schema OrderPlaced v1") || !strings.Contains(err.Error(), `"/cents"`) {
		t.Fatalf("a transformed payload that fails its schema: %d messages, error %v; want the schema's error naming the transform", len(ms), err)
	}
	// The row's own payload lacks cents; the transformed one has it.
	if ms, err := build(`{"total": 2.5}`); err != nil || len(ms) != 1 || !strings.Contains(string(ms[0].Envelope), `"cents":250`) {
		t.Fatalf("a transformed payload that matches its schema: %d messages, %v", len(ms), err)
	}
}
