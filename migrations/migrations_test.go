package migrations

import (
	"strings"
	"testing"
)

// TestRenderColumns: the outbox table is created with the mapped columns,
// only those the mapping has, and the creation time index only on a mapped
// created_at.
func TestRenderColumns(t *testing.T) {
	sql, err := Render(Options{Table: "public.outboxevent", Columns: Columns{ID: "id", AggregateType: "aggregatetype",
		AggregateID: "aggregateid", EventType: "type", Payload: "payload", Traceparent: "tracingspancontext"}})
	if err != nil {
		t.Fatal(err)
	}
	create := sql[strings.Index(sql, `CREATE TABLE IF NOT EXISTS "public"."outboxevent"`):]
	create = create[:strings.Index(create, ");")]
	for _, want := range []string{`"aggregatetype"`, `"aggregateid"`, `"type"`, `"payload"`, `"tracingspancontext"`} {
		if !strings.Contains(create, want) {
			t.Errorf("table lacks %s:\n%s", want, create)
		}
	}
	for _, unwanted := range []string{"aggregate_type", "created_at", "headers", "schema_version"} {
		if strings.Contains(create, unwanted) {
			t.Errorf("table has %s, which the mapping lacks:\n%s", unwanted, create)
		}
	}
	if strings.Contains(sql, "CREATE INDEX outbox_created_at_idx") {
		t.Errorf("a creation time index without a created_at column:\n%s", sql)
	}
	concurrent, err := ConcurrentSQL(Options{Columns: Columns{ID: "id", AggregateType: "a", AggregateID: "b", EventType: "c", Payload: "d"}})
	if err != nil || strings.Contains(concurrent, "CREATE INDEX") {
		t.Errorf("ConcurrentSQL without created_at = %q, %v; want no index", concurrent, err)
	}

	sql, err = Render(Options{Table: "public.outboxevent", Debezium: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(sql, `"public"."outboxevent"`) == 0 || strings.Contains(sql, `"outboxevent", "public"."outboxevent"`) ||
		strings.Contains(sql, `"aggregate_type"`) {
		t.Errorf("--table public.outboxevent --debezium: want the Debezium table once, in Debezium's shape:\n%s", sql)
	}
	if _, err := Render(Options{Partitioned: true, Columns: Columns{ID: "id", AggregateType: "a", AggregateID: "b", EventType: "c", Payload: "d"}}); err == nil ||
		!strings.Contains(err.Error(), "postgres.columns.created_at is empty") {
		t.Errorf("--partitioned without created_at: %v, want an error naming postgres.columns.created_at", err)
	}
}
