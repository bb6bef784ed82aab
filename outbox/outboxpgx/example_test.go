package outboxpgx_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/outbox/outboxpgx"
)

// The event commits with the pgx transaction, or not at all.
func ExampleTx() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit

	if _, err := outbox.Write(ctx, outboxpgx.Tx(tx), outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: map[string]any{"id": 42},
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
