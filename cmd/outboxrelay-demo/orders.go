package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/outbox/outboxpgx"
)

// Kafka topics, from the default template outbox.{aggregate_type}.
const (
	topicOrder    = "outbox.order"
	topicCustomer = "outbox.customer"
)

// The W3C trace context of the request that places order 1001. The outbox
// library stores it with the event, and the relay carries its trace id into
// the envelope.
const (
	sampleTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	sampleSpanID      = "00f067aa0ba902b7"
	sampleTraceparent = "00-" + sampleTraceID + "-" + sampleSpanID + "-01"
)

// rolledBackOrder is the order whose transaction is rolled back: its event
// must never be published.
const rolledBackOrder = "1003"

// expected is one event the demo committed.
type expected struct {
	MessageID     string
	AggregateType string
	AggregateID   string
	EventType     string
}

// Payloads, as the order service defines them.
type (
	orderCreated struct {
		OrderID  int    `json:"order_id"`
		Customer string `json:"customer"`
		Total    string `json:"total"`
	}
	orderPaid struct {
		OrderID int    `json:"order_id"`
		Amount  string `json:"amount"`
		Method  string `json:"method"`
	}
	customerRegistered struct {
		Customer string `json:"customer"`
	}
)

// requestContext is the context of an incoming request whose traceparent
// header the service's tracing middleware has extracted.
func requestContext(ctx context.Context) (context.Context, error) {
	tid, err := trace.TraceIDFromHex(sampleTraceID)
	if err != nil {
		return nil, err
	}
	sid, err := trace.SpanIDFromHex(sampleSpanID)
	if err != nil {
		return nil, err
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(ctx, sc), nil
}

// placeOrder is the order service's write path: the order row and its
// events commit together or not at all. commit false rolls back, as a
// failed payment would.
func placeOrder(ctx context.Context, db *pgx.Conn, sql string, args []any, events []outbox.Event, commit bool) ([]expected, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return nil, err
	}
	var written []expected
	for _, ev := range events {
		id, err := outbox.Write(ctx, outboxpgx.Tx(tx), ev)
		if err != nil {
			return nil, err
		}
		written = append(written, expected{MessageID: id.String(), AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, EventType: ev.EventType})
	}
	if !commit {
		return nil, tx.Rollback(ctx)
	}
	return written, tx.Commit(ctx)
}

// writeOrders plays the order service and returns the committed events.
func writeOrders(ctx context.Context, db *pgx.Conn, p printer) ([]expected, error) {
	var want []expected
	reqCtx, err := requestContext(ctx)
	if err != nil {
		return nil, err
	}

	// Order 1001, placed by a request that carries a traceparent.
	got, err := placeOrder(reqCtx, db, `INSERT INTO orders (id, customer, total, status) VALUES ($1, $2, $3, 'created')`,
		[]any{1001, "alice", "99.90"},
		[]outbox.Event{{
			AggregateType: "order", AggregateID: "1001", EventType: "order.created",
			Payload: orderCreated{OrderID: 1001, Customer: "alice", Total: "99.90"},
			Headers: map[string]string{"tenant": "acme"},
		}}, true)
	if err != nil {
		return nil, fmt.Errorf("order 1001: %w", err)
	}
	want = append(want, got...)
	p.line("committed order 1001: order.created, in a request with traceparent %s", sampleTraceparent)

	// Order 1002, by a new customer: two events in one transaction.
	got, err = placeOrder(ctx, db, `INSERT INTO orders (id, customer, total, status) VALUES ($1, $2, $3, 'created')`,
		[]any{1002, "bob", "15.00"},
		[]outbox.Event{
			{AggregateType: "customer", AggregateID: "bob", EventType: "customer.registered", Payload: customerRegistered{Customer: "bob"}},
			{AggregateType: "order", AggregateID: "1002", EventType: "order.created", Payload: orderCreated{OrderID: 1002, Customer: "bob", Total: "15.00"}},
		}, true)
	if err != nil {
		return nil, fmt.Errorf("order 1002: %w", err)
	}
	want = append(want, got...)
	p.line("committed order 1002: customer.registered and order.created in one transaction")

	// Order 1003: the payment is declined and the transaction rolls back,
	// its outbox row with it.
	_, err = placeOrder(ctx, db, `INSERT INTO orders (id, customer, total, status) VALUES ($1, $2, $3, 'created')`,
		[]any{1003, "carol", "250.00"},
		[]outbox.Event{{
			AggregateType: "order", AggregateID: rolledBackOrder, EventType: "order.created",
			Payload: orderCreated{OrderID: 1003, Customer: "carol", Total: "250.00"},
		}}, false)
	if err != nil {
		return nil, fmt.Errorf("order %s: %w", rolledBackOrder, err)
	}
	p.line("rolled back order %s (payment declined): its event must never arrive", rolledBackOrder)

	// Order 1001 is paid: a second event of the same aggregate, which
	// follows order.created on the same partition.
	got, err = placeOrder(ctx, db, `UPDATE orders SET status = 'paid' WHERE id = $1`,
		[]any{1001},
		[]outbox.Event{{
			AggregateType: "order", AggregateID: "1001", EventType: "order.paid",
			Payload: orderPaid{OrderID: 1001, Amount: "99.90", Method: "card"},
		}}, true)
	if err != nil {
		return nil, fmt.Errorf("order 1001 paid: %w", err)
	}
	want = append(want, got...)
	p.line("committed order 1001 paid: order.paid")
	return want, nil
}
