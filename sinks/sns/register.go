package sns

import (
	"context"
	"errors"
	"strings"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

var (
	_ sinks.Settings   = (*Config)(nil)
	_ sinks.Verifiable = (*Config)(nil)
)

// The configuration file's sink.sns section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "sns",
		Defaults: func() sinks.Settings {
			return &Config{
				BatchSize: DefaultBatchSize, Linger: DefaultLinger, MaxConcurrentBatches: DefaultMaxConcurrentBatches,
				MaxInFlight: DefaultMaxInFlight, MaxMessageBytes: DefaultMaxMessageBytes, Timeout: DefaultTimeout,
			}
		},
		Docs: map[string]string{
			"topic_arn":                "topic ARN, or a template with `{aggregate_type}`, `{event_type}`, `{table}` in the topic name only; a name ending in `.fifo` is a FIFO topic (required)",
			"region":                   "AWS region (default: `AWS_REGION`, the shared configuration)",
			"endpoint":                 "endpoint URL replacing the service's (a VPC endpoint, an emulator)",
			"access_key_id":            "static credentials; without it the SDK's default chain (environment, shared files, web identity, instance role)",
			"secret_access_key":        "secret of `sink.sns.access_key_id`",
			"secret_access_key_file":   "file holding `sink.sns.secret_access_key`",
			"session_token":            "session token of temporary credentials",
			"session_token_file":       "file holding `sink.sns.session_token`",
			"batch_size":               "most messages in one `PublishBatch`, 1 to 10, one of each aggregate; 1 uses `Publish`",
			"linger":                   "how long a batch of fewer waits for more messages",
			"max_concurrent_batches":   "batches sent at once",
			"max_inflight":             "messages published and not yet answered; Publish blocks beyond it",
			"max_message_bytes":        "largest message, body and attributes, up to 256 KiB; a larger one is dead-lettered",
			"timeout":                  "bound of one request",
			"tls.enabled":              "use the TLS settings below",
			"tls.ca_file":              "CA bundle that signs the endpoint's certificate",
			"tls.cert_file":            "client certificate (mutual TLS)",
			"tls.key_file":             "client key (mutual TLS)",
			"tls.server_name":          "name to verify in the endpoint's certificate",
			"tls.insecure_skip_verify": "skip certificate verification (tests only)",
		},
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
	if c.TLSFiles.InsecureSkipVerify {
		ws = append(ws, "sink.sns.tls.insecure_skip_verify accepts any endpoint certificate; use sink.sns.tls.ca_file instead")
	}
	return ws
}

// StaticDestinations returns the topic ARN when it has no placeholder.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.TopicARN) }

// VerifyReader refuses: an SNS topic keeps nothing to read back.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return nil, nil, errors.New("an SNS topic keeps no messages, so verify cannot read it back; " +
		"compare what a subscribed queue's consumers recorded (the message_id attributes) with the outbox")
}
