package outbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// printer stands in for a *sql.Tx in the examples: it prints each
// statement instead of running it.
type printer struct{}

func (printer) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	fmt.Printf("%s -- %d parameters\n", query, len(args))
	return driver.RowsAffected(1), nil
}

// The event commits with the order, or not at all. The driver is any
// database/sql driver for PostgreSQL, such as github.com/jackc/pgx/v5/stdlib.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op after Commit

	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", 42, "99.90"); err != nil {
		log.Fatal(err)
	}
	id, err := outbox.Write(ctx, tx, outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: map[string]any{"id": 42, "total": "99.90"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	log.Printf("order.created %s written", id)
}

func ExampleWrite() {
	_, err := outbox.Write(context.Background(), printer{}, outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: json.RawMessage(`{"total":"99.90"}`), Headers: map[string]string{"tenant": "acme"},
	})
	fmt.Println(err)
	// Output:
	// INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "traceparent", "schema_version") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) -- 8 parameters
	// <nil>
}

// An invalid event is refused before anything is sent, so the transaction
// stays usable.
func ExampleWrite_invalid() {
	_, err := outbox.Write(context.Background(), printer{}, outbox.Event{AggregateType: "order", EventType: "order.created"})
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent))
	// Output:
	// true
}

// One statement for many events; the ids come back in the events' order.
func ExampleWriteBatch() {
	ids, err := outbox.WriteBatch(context.Background(), printer{}, []outbox.Event{
		{AggregateType: "order", AggregateID: "42", EventType: "order.created", Payload: json.RawMessage(`{}`)},
		{AggregateType: "order", AggregateID: "42", EventType: "order.paid", Payload: json.RawMessage(`{}`)},
	})
	fmt.Println(len(ids), err)
	// Output:
	// INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "traceparent", "schema_version") VALUES ($1, $2, $3, $4, $5, $6, $7, $8), ($9, $10, $11, $12, $13, $14, $15, $16) -- 16 parameters
	// 2 <nil>
}

// A Debezium-style table whose rows are deleted in the same transaction:
// the relay reads them from the WAL, and the table stays empty.
func ExampleNew() {
	w, err := outbox.New(outbox.TableName("shop.outboxevent"), outbox.Debezium(), outbox.DeleteAfterInsert())
	if err != nil {
		log.Fatal(err)
	}
	_, err = w.Write(context.Background(), printer{}, outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "order.created", Payload: json.RawMessage(`{}`),
	})
	fmt.Println(err)
	// Output:
	// INSERT INTO "shop"."outboxevent" ("id", "aggregatetype", "aggregateid", "type", "payload", "tracingspancontext") VALUES ($1, $2, $3, $4, $5, $6) -- 6 parameters
	// DELETE FROM "shop"."outboxevent" WHERE "id" IN ($1) -- 1 parameters
	// <nil>
}

// A table-less message: nothing is stored, the relay reads it from the WAL.
func ExampleWriter_Emit() {
	w, err := outbox.New(outbox.MessagePrefix("shop"))
	if err != nil {
		log.Fatal(err)
	}
	_, err = w.Emit(context.Background(), printer{}, outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "order.created", Payload: json.RawMessage(`{}`),
	})
	fmt.Println(err)
	// Output:
	// SELECT pg_logical_emit_message(true, $1::text, $2::text) -- 2 parameters
	// <nil>
}

// versions is a Validator that knows one schema version per event type;
// a *schema.Set from github.com/outboxrelay/outboxrelay/outbox/schema checks the
// payloads against JSON Schemas, as the relay does.
type versions map[string]int

func (v versions) Validate(eventType string, schemaVersion int, _ []byte) error {
	if v[eventType] != schemaVersion {
		return fmt.Errorf("no schema for %s version %d", eventType, schemaVersion)
	}
	return nil
}

func ExampleSchemas() {
	w, err := outbox.New(outbox.Schemas(versions{"order.created": 2}))
	if err != nil {
		log.Fatal(err)
	}
	_, err = w.Write(context.Background(), printer{}, outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "order.created", SchemaVersion: 3, Payload: json.RawMessage(`{}`),
	})
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent))
	// Output:
	// true
}
