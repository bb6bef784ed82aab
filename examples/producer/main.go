// Command producer is an example service that writes an outbox event with
// its business change, in one pgx transaction, using package outbox.
//
// It places an order: the orders row and the order.created event commit
// together or not at all, and outboxrelay publishes the event to
// outbox.order once the transaction commits.
//
//	outboxrelay migrate --database-url "$DATABASE_URL"
//	go run ./examples/producer -database-url "$DATABASE_URL" -order-id 42
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/outbox/outboxpgx"
)

// Order is the business object and the event payload.
type Order struct {
	ID       int64  `json:"order_id"`
	Customer string `json:"customer"`
	Total    string `json:"total"`
}

func main() {
	url := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	id := flag.Int64("order-id", 42, "id of the order to place")
	flag.Parse()

	// A real service installs its TracerProvider with an exporter once at
	// startup; spans started from it reach the consumer through the outbox.
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	otel.SetTracerProvider(tp)

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(2)
	}
	defer pool.Close()

	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL)`); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
	o := Order{ID: *id, Customer: "acme", Total: "99.90"}
	msgID, err := placeOrder(ctx, pool, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
	fmt.Printf("order %d placed: message_id=%s\n", o.ID, msgID)
}

// placeOrder inserts the order and its event in one transaction.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, o Order) (string, error) {
	ctx, span := otel.Tracer("examples/producer").Start(ctx, "place order")
	defer span.End()

	var msgID string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)`, o.ID, o.Customer, o.Total); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		id, err := outbox.Write(ctx, outboxpgx.Tx(tx), outbox.Event{
			AggregateType: "order",
			AggregateID:   fmt.Sprint(o.ID),
			EventType:     "order.created",
			Payload:       o,
			Headers:       map[string]string{"tenant": o.Customer},
		})
		msgID = id.String()
		return err
	})
	if err != nil {
		return "", err
	}
	fmt.Printf("trace_id=%s\n", trace.SpanContextFromContext(ctx).TraceID())
	return msgID, nil
}
