package schema_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"testing"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

// statements counts what an outbox.Writer sends instead of sending it.
type statements int

func (n *statements) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	*n++
	return driver.RowsAffected(1), nil
}

// TestOutboxSchemasRefuseBeforeSQL: a schema.Set passed to outbox.Schemas
// (package outbox is a module of its own and knows only its Validator
// interface) refuses a payload the relay would refuse, before any SQL.
func TestOutboxSchemasRefuseBeforeSQL(t *testing.T) {
	set, err := schema.Load("testdata/schemas")
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Schemas(set))
	if err != nil {
		t.Fatal(err)
	}
	var sent statements
	bad := outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: map[string]any{"order_id": 42, "total": 99.9}}
	for name, write := range map[string]func() error{
		"Write": func() error { _, err := w.Write(t.Context(), &sent, bad); return err },
		"Emit":  func() error { _, err := w.Emit(t.Context(), &sent, bad); return err },
		"WriteBatch": func() error {
			_, err := w.WriteBatch(t.Context(), &sent, []outbox.Event{{AggregateType: "order", AggregateID: "1",
				EventType: "order.created", Payload: json.RawMessage(`{"order_id": 1, "total": "1"}`)}, bad})
			return err
		},
	} {
		err := write()
		var verr *schema.ValidationError
		if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &verr) || verr.Pointer != "/total" {
			t.Errorf("%s: error %v, want ErrInvalidEvent with a schema error at /total", name, err)
		}
	}
	missing := outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created", SchemaVersion: 9,
		Payload: json.RawMessage(`{}`)}
	if _, err := w.Write(t.Context(), &sent, missing); !errors.Is(err, schema.ErrNoSchema) {
		t.Errorf("version without a schema: error %v, want ErrNoSchema", err)
	}
	if sent > 0 {
		t.Fatalf("refused events sent %d statements", sent)
	}
	good := outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created", SchemaVersion: 2,
		Payload: json.RawMessage(`{"order_id": 42, "total": "99.90", "currency": "USD"}`)}
	if _, err := w.Write(t.Context(), &sent, good); err != nil || sent != 1 {
		t.Fatalf("valid event: %v, %d statements", err, sent)
	}
}
