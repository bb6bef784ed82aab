package verify

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitMQ reads a verification queue. RabbitMQ keeps no log to read: a
// queue's messages can only be taken from it, and the consumers' queues
// are theirs. What is honest is a queue of verify's own, bound to the
// relay's exchange with binding key "#" before the window starts, which
// holds a copy of every message (bound with a message TTL or x-max-length
// as its retention). Read takes every message the queue held when it
// started, without acknowledging them, and then closes its channel, which
// returns them all to the queue: the queue is left as it was.
type RabbitMQ struct {
	URL   string
	Queue string
}

var _ Reader = RabbitMQ{}

// Read implements Reader; it ignores destinations and since (the queue
// holds what it was bound for).
func (q RabbitMQ) Read(ctx context.Context, _ time.Time, _ []string, fn func(id string) error) error {
	conn, err := amqp.DialConfig(q.URL, amqp.Config{Properties: amqp.Table{"connection_name": "outboxrelay verify"}})
	if err != nil {
		return fmt.Errorf("connect to rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close() // returns every message taken to the queue
	info, err := ch.QueueDeclarePassive(q.Queue, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("verification queue %q: %w; declare it and bind it to the exchange with binding key \"#\" before the window to verify", q.Queue, err)
	}
	for i := 0; i < info.Messages; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := ch.Get(q.Queue, false)
		if err != nil {
			return fmt.Errorf("read verification queue %q: %w", q.Queue, err)
		}
		if !ok {
			return nil
		}
		if d.MessageId != "" {
			if err := fn(d.MessageId); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close implements Reader.
func (RabbitMQ) Close() error { return nil }
