package pubsub

import (
	"errors"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

// VerifyReader refuses: a Pub/Sub topic keeps no messages of its own, only
// its subscriptions do, and reading one consumes it.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return nil, nil, errors.New("a pubsub topic cannot be read back without consuming a subscription, so verify cannot see what reached it; " +
		"compare the message_id attributes your subscribers recorded with the outbox, or use a sink whose broker verify reads")
}
