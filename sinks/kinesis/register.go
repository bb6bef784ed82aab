package kinesis

import (
	"context"
	"strings"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ sinks.Settings      = (*Config)(nil)
	_ sinks.Verifiable    = (*Config)(nil)
	_ sinks.FormatChecker = (*Config)(nil)
)

// The configuration file's sink.kinesis section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "kinesis",
		Defaults: func() sinks.Settings {
			return &Config{Timeout: DefaultTimeout, MaxInFlight: DefaultMaxInFlight, MaxRequests: DefaultMaxRequests, RecordAttempts: DefaultRecordAttempts}
		},
		Docs: map[string]string{
			"stream":                 "stream name template; `{aggregate_type}`, `{event_type}`, `{table}` (required)",
			"region":                 "AWS region of the streams (required)",
			"endpoint":               "Kinesis endpoint URL, for a VPC endpoint, kinesalite or LocalStack",
			"access_key_id":          "AWS access key id; empty: the SDK's default credential chain",
			"secret_access_key":      "AWS secret access key",
			"secret_access_key_file": "file holding `sink.kinesis.secret_access_key`",
			"timeout":                "bound of one PutRecords call",
			"max_inflight":           "messages published and not yet acknowledged; Publish blocks beyond it",
			"max_requests":           "PutRecords calls at once",
			"record_attempts":        "puts of a record Kinesis refused in a PutRecords answer before the relay is told",
		},
	})
}

// Open creates the sink and checks the credentials, that Kinesis answers
// and that the stream exists.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "kinesis", s, err, func(err error) error { return err }) // Connect's error names what to check
}

// Warnings names an endpoint that sends the credentials unencrypted.
func (c *Config) Warnings() []string {
	if strings.HasPrefix(c.Endpoint, "http://") && c.AccessKeyID != "" && !strings.HasPrefix(c.Endpoint, "http://127.0.0.1") && !strings.HasPrefix(c.Endpoint, "http://localhost") {
		return []string{"sink.kinesis.endpoint is http:// and sends signed requests unencrypted; use https://"}
	}
	return nil
}

// StaticDestinations returns the stream name of a template without
// placeholders, as metrics label it.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.Stream) }
