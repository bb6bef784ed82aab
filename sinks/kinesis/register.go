package kinesis

import (
	"context"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
)

var (
	_ sinks.Settings      = (*Config)(nil)
	_ sinks.Verifiable    = (*Config)(nil)
	_ sinks.FormatChecker = (*Config)(nil)
)

// The configuration file's sink.kinesis section is a Config.
func init() {
	docs := awssink.ConnectionDocs(service)
	docs["stream"] = "stream name template; `{aggregate_type}`, `{event_type}`, `{table}` (required)"
	docs["max_inflight"] = "messages published and not yet acknowledged; Publish blocks beyond it"
	docs["max_requests"] = "PutRecords calls at once"
	docs["record_attempts"] = "puts of a record Kinesis refused in a PutRecords answer before the relay is told"
	sinks.Register(sinks.Type{
		Name: "kinesis",
		Defaults: func() sinks.Settings {
			return &Config{Connection: awssink.Connection{}.WithDefaults(), MaxInFlight: DefaultMaxInFlight, MaxRequests: DefaultMaxRequests, RecordAttempts: DefaultRecordAttempts}
		},
		Docs: docs,
	})
}

// Open creates the sink and checks the credentials, that Kinesis answers
// and that the stream exists.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "kinesis", s, err, func(err error) error { return err }) // Connect's error names what to check
}

// Warnings names the settings that leave the endpoint unverified or send
// signed requests unencrypted.
func (c *Config) Warnings() []string { return c.Connection.Warnings(service) }

// StaticDestinations returns the stream name of a template without
// placeholders, as metrics label it.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.Stream) }
