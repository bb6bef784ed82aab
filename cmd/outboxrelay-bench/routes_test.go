package main

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/internal/rules"
)

// The relay->kafka+routes variant measures the rules only if they compile
// and every benchmark row passes the first nine routes and takes the tenth
// to the topic the record counter reads, with the transform's key and
// header: a rule that matched earlier, or failed, would measure less than
// the issue asks for (or show as rows missing from the broker).
func TestBenchRoutesTakeEveryRowToTheLastRoute(t *testing.T) {
	var c rules.Config
	if err := yaml.Unmarshal([]byte(benchRoutes), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 10 || c.Transform.Key == "" || len(c.Transform.Headers) != 1 {
		t.Fatalf("benchRoutes has %d routes, transform key %q and %d headers; want 10 routes, a key and a header", len(c.Routes), c.Transform.Key, len(c.Transform.Headers))
	}
	set, err := rules.Compile(c)
	if err != nil {
		t.Fatal(err)
	}
	g := newRowGen(1024)
	for range 3 {
		p := g.next(nil)
		row := &rules.Row{MessageID: "m", AggregateType: string(p[0]), AggregateID: string(p[1]), EventType: string(p[2]),
			Table: "public.outbox", SchemaVersion: 1, Headers: map[string]string{}, Payload: p[3],
			Columns: map[string]string{"aggregate_type": string(p[0]), "aggregate_id": string(p[1]), "event_type": string(p[2]), "payload": string(p[3])}}
		d, err := set.Decide(row)
		if err != nil {
			t.Fatalf("row %s: %v", p[1], err)
		}
		if len(d.Matches) != 1 {
			t.Fatalf("row %s took %d routes, want 1", p[1], len(d.Matches))
		}
		m := d.Matches[0]
		if m.Route != "orders" || strings.ReplaceAll(m.Destination, "{aggregate_type}", row.AggregateType) != topic {
			t.Errorf("row %s: route %s, destination %q; want the last route, orders, to %s", p[1], m.Route, m.Destination, topic)
		}
		if m.Key != "order:"+row.AggregateID || !hasHeader(m, "x-seq") {
			t.Errorf("row %s: key %q, headers %v; want the transform's key and x-seq header", p[1], m.Key, m.Headers)
		}
	}
}

func hasHeader(m rules.Match, name string) bool {
	v, ok := m.Header(name)
	return ok && v != ""
}
