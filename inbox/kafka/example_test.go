package kafka_test

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/kafka"
)

// accountTopic is the topic the relay's Kafka sink publishes aggregate type
// account to by default (sink.kafka.topic, outbox.{aggregate_type}).
// This module cannot import the relay's, so the relay's module checks it
// against the sink's default (internal/doccheck,
// TestConsumerGuideBuildsFromAClone), as it checks docs/consumers.md.
const accountTopic = "outbox.account"

// The consumer guide's complete Kafka consumer (docs/consumers.md):
// compiled here, so that it stays true to the API.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil { // or review inbox.SQL("") and migrate yourself
		panic(err)
	}
	in, err := inbox.New(pool, "billing", inbox.Config{})
	if err != nil {
		panic(err)
	}
	deposit := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var d struct {
			Account string `json:"account"`
			Amount  int64  `json:"amount"`
		}
		if err := json.Unmarshal(m.Payload, &d); err != nil {
			return inbox.Permanent(err) // no retry: dead-letter it
		}
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", d.Amount, d.Account)
		return err
	}
	r, err := kafka.New(in, deposit, kafka.Config{
		Brokers: []string{"localhost:9092"}, Group: "billing", Topics: []string{accountTopic},
	})
	if err != nil {
		panic(err)
	}
	if err := r.Run(ctx); err != nil { // returns after SIGTERM, in-flight work drained
		panic(err)
	}
}
