package schema_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

// printer stands in for a *sql.Tx: it prints each statement instead of
// running it.
type printer struct{}

func (printer) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	fmt.Printf("%s -- %d parameters\n", query, len(args))
	return driver.RowsAffected(1), nil
}

// A service validates its events at the source against the schema folder
// the relay checks (relay.schemas.dir): a payload that breaks its schema is
// refused before any SQL runs, and the transaction stays usable.
func ExampleLoad() {
	set, err := schema.Load("testdata/schemas") // EVENT_TYPE/vN.json
	if err != nil {
		log.Fatal(err)
	}
	w, err := outbox.New(outbox.Schemas(set))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	_, err = w.Write(ctx, printer{}, outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: map[string]any{"order_id": 42, "total": "99.90"}})
	fmt.Println(err)
	_, err = w.Write(ctx, printer{}, outbox.Event{AggregateType: "order", AggregateID: "43", EventType: "order.created",
		Payload: map[string]any{"order_id": 0}})
	fmt.Println(err)
	var verr *schema.ValidationError
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent), errors.As(err, &verr))
	// Output:
	// INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "traceparent", "schema_version") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) -- 8 parameters
	// <nil>
	// outbox: invalid outbox event: payload does not match schema order.created v1: at "", rule order.created/v1.json#/required: missing property 'total' (and 1 more)
	// true true
}
