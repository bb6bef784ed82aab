// Command consumer is an example Kafka consumer of outboxrelay envelopes,
// effectively-once through the inbox (github.com/outboxrelay/outboxrelay/inbox).
//
// The relay delivers every committed outbox row at least once: a relay
// restart, a rebalance or a crash between this consumer's commit and its
// offset commit delivers a message again. The inbox records each message
// id in the consumer's database in the same transaction as the handler's
// writes, so a redelivery finds the record and the handler does not run
// twice. Here the handler counts each order's events, a write that would
// be wrong if it ran twice; what it prints, it prints from the inbox's
// Observer, after the commit.
//
// What the inbox cannot cover: an effect outside this database (an email,
// a payment API call) can happen and then its transaction roll back, and
// happen again on the redelivery. Give such a call an idempotency key the
// remote side dedupes on, the message id for instance.
//
// The handler continues the producer's trace: the traceparent the relay
// carries makes the producer's span its parent.
//
//	go run ./examples/consumer -brokers 127.0.0.1:9092 -topic outbox.order -database-url postgres://...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/kafka"
)

// Options are the consumer's settings: main's flags.
type Options struct {
	Brokers     []string
	Topic       string
	Group       string // the consumer group, and the inbox's consumer name
	DatabaseURL string
	Batch       int // > 1: that many records per transaction
	Verbose     bool
}

func main() {
	var o Options
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	flag.StringVar(&o.Topic, "topic", "outbox.order", "topic to consume")
	flag.StringVar(&o.Group, "group", "order-consumer", "consumer group, and the inbox's consumer name")
	flag.StringVar(&o.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "the consumer's PostgreSQL (env DATABASE_URL)")
	flag.IntVar(&o.Batch, "batch", 0, "records per transaction (0: one)")
	flag.BoolVar(&o.Verbose, "v", false, "log the runner's warnings to stderr")
	flag.Parse()
	o.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A real service installs an SDK TracerProvider with an exporter here;
	// with the default no-op provider the trace context is still carried.
	if err := Run(ctx, o, otel.Tracer("examples/consumer"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// Tables is the handler's own table: events per order.
const Tables = `CREATE TABLE IF NOT EXISTS order_event_counts (
	order_id text PRIMARY KEY,
	events   bigint NOT NULL
)`

// Run consumes until ctx ends (SIGTERM), then drains and returns nil.
func Run(ctx context.Context, o Options, tracer trace.Tracer, out io.Writer) error {
	if o.DatabaseURL == "" {
		return errors.New("no database: set -database-url or DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool, ""); err != nil { // or review inbox.SQL("") and migrate yourself
		return err
	}
	if _, err := pool.Exec(ctx, Tables); err != nil {
		return err
	}
	in, err := inbox.New(pool, o.Group, inbox.Config{Observer: inbox.Observer{
		// Called after the commit: output is a side effect outside the
		// database, so it comes only once the effect is durable.
		Processed: func(m inbox.Message, _ time.Duration) {
			fmt.Fprintf(out, "processed %s %s aggregate=%s/%s trace_id=%s payload=%s\n", m.ID, m.EventType,
				m.AggregateType, m.AggregateID, traceOf(m), m.Payload)
		},
		Duplicate:    func(m inbox.Message) { fmt.Fprintf(out, "duplicate %s\n", m.ID) },
		DeadLettered: func(m inbox.Message, err error) { fmt.Fprintf(out, "dead letter %s: %v\n", m.ID, err) },
	}})
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if o.Verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	r, err := kafka.New(in, handler(tracer), kafka.Config{Brokers: o.Brokers, Group: o.Group, Topics: []string{o.Topic},
		Batch: o.Batch, Logger: log, Opts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// handler is the business logic, in the inbox's transaction: it commits
// with the message's inbox record or not at all.
func handler(tracer trace.Tracer) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": m.Traceparent})
		ctx, span := tracer.Start(ctx, "process "+m.EventType, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.message.id", m.ID)))
		defer span.End()
		_, err := tx.Exec(ctx, `INSERT INTO order_event_counts (order_id, events) VALUES ($1, 1)
ON CONFLICT (order_id) DO UPDATE SET events = order_event_counts.events + 1`, m.AggregateID)
		if err != nil {
			span.RecordError(err)
		}
		return err
	}
}

// traceOf is the trace the message's traceparent names, for the output.
func traceOf(m inbox.Message) string {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": m.Traceparent})
	return trace.SpanContextFromContext(ctx).TraceID().String()
}
