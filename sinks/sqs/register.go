package sqs

import (
	"context"
	"errors"
	"strings"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/verify"
)

var (
	_ sinks.Settings   = (*Config)(nil)
	_ sinks.Verifiable = (*Config)(nil)
)

// The configuration file's sink.sqs section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name:     "sqs",
		Defaults: func() sinks.Settings { return &Config{Common: awssink.Defaults()} },
		Docs:     awssink.Docs(service, "queue_url", "queue URL, or a template with `{aggregate_type}`, `{event_type}`, `{table}` in the queue name only; a name ending in `.fifo` is a FIFO queue (required)"),
	})
}

// Open creates the sink and checks that the queue answers.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "sqs", s, err, func(err error) error { return err }) // Connect's error names what to check
}

// Warnings names the settings that leave messages unordered or unverified.
func (c *Config) Warnings() []string {
	var ws []string
	if c.QueueURL != "" && !strings.HasSuffix(c.QueueURL, ".fifo") {
		ws = append(ws, "sink.sqs.queue_url is a standard queue, which may deliver an aggregate's messages out of order and twice; use a FIFO queue (.fifo) where consumers need per-aggregate order")
	}
	return append(ws, c.Common.Warnings(service)...)
}

// StaticDestinations returns the queue URL when it has no placeholder.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.QueueURL) }

// VerifyReader refuses: reading an SQS queue consumes (hides) its
// messages from the consumers it serves.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return nil, nil, errors.New("verify cannot read an SQS queue without taking its messages from its consumers; " +
		"compare the consumers' own record of the message_id attributes they processed with the outbox")
}
