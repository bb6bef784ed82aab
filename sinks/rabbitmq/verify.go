package rabbitmq

import (
	"context"
	"fmt"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
	amqp "github.com/rabbitmq/amqp091-go"
	"time"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the verification queue opts.Queue: RabbitMQ cannot
// show what reached an exchange without a queue that was bound to it.
func (c *Config) VerifyReader(opts sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	if opts.Queue == "" {
		return nil, nil, fmt.Errorf("RabbitMQ queues cannot be read without consuming them, so verify cannot see what reached the exchange; "+
			"declare a verification queue bound to exchange %q with binding key \"#\" (it holds a copy of every message from then on) and pass it with --rabbitmq-queue NAME", c.Exchange)
	}
	return verifyReader{URL: c.URL, Queue: opts.Queue}, nil, nil
}

// verifyReader reads a verification queue. RabbitMQ keeps no log to read: a
// queue's messages can only be taken from it, and the consumers' queues
// are theirs. What is honest is a queue of verify's own, bound to the
// relay's exchange with binding key "#" before the window starts, which
// holds a copy of every message (bound with a message TTL or x-max-length
// as its retention). Read takes every message the queue held when it
// started, without acknowledging them, and then closes its channel, which
// returns them all to the queue: the queue is left as it was.
type verifyReader struct {
	URL   string
	Queue string
}

var _ verify.Reader = verifyReader{}

// Read implements verify.Reader; it ignores destinations and since (the queue
// holds what it was bound for).
func (q verifyReader) Read(ctx context.Context, _ time.Time, _ []string, fn func(id string) error) error {
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

// Close implements verify.Reader.
func (verifyReader) Close() error { return nil }
