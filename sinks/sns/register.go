package sns

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

// The configuration file's sink.sns section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name:     "sns",
		Defaults: func() sinks.Settings { return &Config{Common: awssink.Defaults()} },
		Docs:     awssink.Docs(service, "topic_arn", "topic ARN, or a template with `{aggregate_type}`, `{event_type}`, `{table}` in the topic name only; a name ending in `.fifo` is a FIFO topic (required)"),
	})
}

// Open creates the sink and checks that the topic answers.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "sns", s, err, func(err error) error { return err }) // Connect's error names what to check
}

// Warnings names the settings that leave messages unordered or unverified.
func (c *Config) Warnings() []string {
	var ws []string
	if c.TopicARN != "" && !strings.HasSuffix(c.TopicARN, ".fifo") {
		ws = append(ws, "sink.sns.topic_arn is a standard topic, which may deliver an aggregate's messages out of order and twice; use a FIFO topic (.fifo) where subscribers need per-aggregate order")
	}
	return append(ws, c.Common.Warnings(service)...)
}

// StaticDestinations returns the topic ARN when it has no placeholder.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.TopicARN) }

// VerifyReader refuses: an SNS topic keeps nothing to read back.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return nil, nil, errors.New("an SNS topic keeps no messages, so verify cannot read it back; " +
		"compare what a subscribed queue's consumers recorded (the message_id attributes) with the outbox")
}
