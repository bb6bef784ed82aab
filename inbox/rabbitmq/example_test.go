package rabbitmq_test

import (
	"context"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/rabbitmq"
)

// The consumer guide's rabbitmq consumer is the Kafka one
// (inbox/kafka/example_test.go) with this runner in place of kafka.New:
// ctx ends on SIGTERM, in is the inbox over the consumer's database,
// deposit the handler. Compiled here, so that it stays true to the API.
func Example() {
	var (
		ctx     context.Context
		in      *inbox.Inbox
		deposit inbox.Handler
	)
	r, err := rabbitmq.New(in, deposit, rabbitmq.Config{URL: "amqp://guest:guest@localhost:5672/", Queue: "billing"})
	if err != nil {
		panic(err)
	}
	if err := r.Run(ctx); err != nil { // returns after SIGTERM, in-flight work drained
		panic(err)
	}
}
