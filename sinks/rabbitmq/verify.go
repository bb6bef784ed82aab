package rabbitmq

import (
	"fmt"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the verification queue opts.Queue: RabbitMQ cannot
// show what reached an exchange without a queue that was bound to it.
func (c *Config) VerifyReader(opts sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	if opts.Queue == "" {
		return nil, nil, fmt.Errorf("RabbitMQ queues cannot be read without consuming them, so verify cannot see what reached the exchange; "+
			"declare a verification queue bound to exchange %q with binding key \"#\" (it holds a copy of every message from then on) and pass it with --rabbitmq-queue NAME", c.Exchange)
	}
	return verify.RabbitMQ{URL: c.URL, Queue: opts.Queue}, nil, nil
}
