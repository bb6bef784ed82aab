package nats_test

import (
	"context"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/nats"
)

// The consumer guide's nats consumer is the Kafka one
// (inbox/kafka/example_test.go) with this runner in place of kafka.New:
// ctx ends on SIGTERM, in is the inbox over the consumer's database,
// deposit the handler. Compiled here, so that it stays true to the API.
func Example() {
	var (
		ctx     context.Context
		in      *inbox.Inbox
		deposit inbox.Handler
	)
	r, err := nats.New(in, deposit, nats.Config{URL: "nats://localhost:4222", Stream: "OUTBOX", Consumer: "billing"})
	if err != nil {
		panic(err)
	}
	if err := r.Run(ctx); err != nil { // returns after SIGTERM, in-flight work drained
		panic(err)
	}
}
