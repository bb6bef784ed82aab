package pubsub

import (
	"context"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ sinks.Settings   = (*Config)(nil)
	_ sinks.Verifiable = (*Config)(nil)
)

// The configuration file's sink.pubsub section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name:     "pubsub",
		Defaults: func() sinks.Settings { return &Config{Timeout: DefaultTimeout, MaxInFlight: DefaultMaxInFlight} },
		Docs: map[string]string{
			"project":          "Google Cloud project id that holds the topics (required)",
			"topic":            "topic id template; `{aggregate_type}`, `{event_type}`, `{table}` (required)",
			"credentials_file": "service account key file; empty: the application default credentials (none with `PUBSUB_EMULATOR_HOST`)",
			"endpoint":         "Pub/Sub API address `host:port`, for a regional or private endpoint",
			"timeout":          "bound of one publish, the client's retries included",
			"max_inflight":     "messages published and not yet acknowledged; Publish blocks beyond it",
		},
	})
}

// Open creates the sink and checks that Pub/Sub answers and the topic
// exists.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "pubsub", s, err, func(err error) error { return err }) // Connect's error names what to check
}

// Warnings has none: the client always uses TLS and Google's credentials.
func (c *Config) Warnings() []string { return nil }

// StaticDestinations returns the topic id of a template without
// placeholders, as metrics label it.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.Topic) }
