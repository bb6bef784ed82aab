package nats_test

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/nats"
)

// The consumer guide's complete nats consumer: compiled here, so that it
// stays true to the API.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil { // or: outboxrelay migrate --inbox
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
	r, err := nats.New(in, deposit, nats.Config{URL: "nats://localhost:4222", Stream: "OUTBOX", Consumer: "billing"})
	if err != nil {
		panic(err)
	}
	if err := r.Run(ctx); err != nil { // returns after SIGTERM, in-flight work drained
		panic(err)
	}
}
