package rabbitmq

import (
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// newQueue connects to the tests' RabbitMQ and declares a durable queue
// of a name of its own (prefix, the pid, the time) with args; the caller
// deletes it and closes conn.
func newQueue(t *testing.T, prefix string, args amqp.Table) (*amqp.Connection, *amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		consumertest.Unreachable(t, "RabbitMQ", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	queue := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn, ch, queue
}
