package nats

import (
	"context"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var _ sinks.Settings = (*Config)(nil)

// The configuration file's sink.nats section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "nats",
		Defaults: func() sinks.Settings {
			return &Config{
				URL: DefaultURL, Subject: DefaultSubject, Stream: DefaultStream,
				DuplicateWindow: DefaultDuplicateWindow, MaxInFlight: DefaultMaxInFlight, AckTimeout: DefaultAckTimeout,
			}
		},
		Docs: map[string]string{
			"url":              "NATS server URL",
			"url_file":         "file holding `sink.nats.url`",
			"subject":          "subject template: `{aggregate_type}`, `{event_type}`, `{table}`",
			"stream":           "JetStream stream that must capture the subjects",
			"create_stream":    "create the stream when it is missing",
			"duplicate_window": "dedupe window of a created stream",
			"max_inflight":     "messages in flight (published, not yet acknowledged) before Publish waits",
			"max_pending":      "deprecated: the old name of `max_inflight`",
			"ack_timeout":      "wait for a PubAck before retrying",
			"credentials_file": "NATS credentials (.creds) file",
		},
	})
}

// Open creates the sink and connects it, checking that the stream exists
// (or creating it) and captures the subjects.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "nats", s, err, sinks.Unreachable("NATS JetStream"))
}

// Warnings names the deprecated keys set: no NATS setting works while
// exposing something.
func (c *Config) Warnings() []string {
	if c.MaxPending != 0 {
		return []string{maxPending.Warning()}
	}
	return nil
}

// StaticDestinations: see sinks.StaticDestination.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.Subject) }
