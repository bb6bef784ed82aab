package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// The configuration file's sink.kafka section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "kafka",
		Defaults: func() sinks.Settings {
			return &Config{Topic: DefaultTopic, Compression: DefaultCompression, ValueFormat: ValueJSON,
				SchemaRegistry: SchemaRegistry{SubjectStrategy: SubjectTopic}}
		},
		Docs: map[string]string{
			"brokers":                                  "seed brokers, host:port",
			"topic":                                    "topic template: `{aggregate_type}`, `{event_type}`, `{table}`",
			"linger":                                   "how long a partition batch waits for more records",
			"compression":                              "batch codec: `none`, `gzip`, `snappy`, `lz4` or `zstd`; the default is one every stock client reads without plugins",
			"tls.enabled":                              "connect with TLS",
			"tls.ca_file":                              "CA bundle that signs the brokers' certificates",
			"tls.cert_file":                            "client certificate (mutual TLS)",
			"tls.key_file":                             "client key (mutual TLS)",
			"tls.server_name":                          "name to verify in the brokers' certificates",
			"tls.insecure_skip_verify":                 "skip certificate verification (tests only)",
			"exactly_once":                             "transactional producer: each Kafka transaction holds whole source transactions and the relay's position; consumers read with `isolation.level=read_committed`",
			"transactional_id":                         "Kafka `transactional.id` of `exactly_once`; default `outboxrelay-` and postgres.slot",
			"sasl.mechanism":                           "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`",
			"sasl.username":                            "SASL user",
			"sasl.password":                            "SASL password",
			"sasl.password_file":                       "file holding the SASL password",
			"value_format":                             "record value: `json` (the body of envelope.format), or the payload in the Confluent wire format, `confluent-json-schema` or `confluent-avro`, which need envelope.format `cloudevents-binary`",
			"schemas_dir":                              "schema folder of the Confluent formats: `<event_type>/v<N>.json` (JSON Schema) and `<event_type>/v<N>.avsc` (Avro)",
			"schema_registry.url":                      "Confluent-compatible Schema Registry, `http://` or `https://`, may carry `user:password@`",
			"schema_registry.url_file":                 "file holding schema_registry.url",
			"schema_registry.username":                 "basic authentication user (an API key)",
			"schema_registry.password":                 "basic authentication password (an API secret)",
			"schema_registry.password_file":            "file holding schema_registry.password",
			"schema_registry.tls.enabled":              "TLS settings of an `https://` registry; without them the system roots verify it",
			"schema_registry.tls.ca_file":              "CA bundle that signs the registry's certificate",
			"schema_registry.tls.cert_file":            "client certificate (mutual TLS)",
			"schema_registry.tls.key_file":             "client key (mutual TLS)",
			"schema_registry.tls.server_name":          "name to verify in the registry's certificate",
			"schema_registry.tls.insecure_skip_verify": "skip certificate verification (tests only)",
			"schema_registry.subject_strategy":         "`topic`: subject `<topic>-value`; `record`: the Avro full name, or the JSON Schema's title, else the event type",
		},
	})
}

// Open creates the sink and pings the brokers; errors name the settings
// to check (authentication, TLS) and are meant for the operator.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	if c.ExactlyOnce {
		s, err := NewTxn(*c, log)
		if err != nil {
			return nil, fmt.Errorf("sink.kafka: %w", err)
		}
		if err := s.Ping(ctx); err != nil {
			_ = s.Close()
			return nil, c.pingError(err)
		}
		return s, nil
	}
	s, err := New(*c, log)
	if err != nil {
		return nil, fmt.Errorf("sink.kafka: %w", err)
	}
	if err := s.Ping(ctx); err != nil {
		_ = s.Close()
		return nil, c.pingError(err)
	}
	return s, nil
}

func (c *Config) pingError(err error) error {
	var rd *registryDown
	switch {
	case errors.As(err, &rd):
		return err
	case errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.IllegalSaslState) || errors.Is(err, kerr.UnsupportedSaslMechanism):
		return fmt.Errorf("cannot reach Kafka: authentication failed for user %q with %s; check sink.kafka.sasl.mechanism, username and password (%v)",
			c.SASL.Username, c.SASL.Mechanism, err)
	case c.SASL.Mechanism != "" && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		// Some brokers drop the connection instead of answering a failed
		// authentication.
		return fmt.Errorf("cannot reach Kafka: the broker closed the connection, as it does when authentication failed for user %q with %s; check sink.kafka.sasl.mechanism, username and password, and sink.kafka.tls.enabled",
			c.SASL.Username, c.SASL.Mechanism)
	}
	if ce := sinks.CertError(err); ce != nil {
		return fmt.Errorf("cannot reach Kafka: the broker's TLS certificate did not verify (%v); check sink.kafka.tls.ca_file and server_name", ce)
	}
	return fmt.Errorf("cannot reach Kafka: %w", err)
}

// CheckFormat refuses a Confluent value format with any envelope.format
// other than cloudevents-binary: the record value holds the bare payload,
// which only the binary content mode leaves for the sink to frame.
func (c *Config) CheckFormat(format relay.Format) error {
	if confluent(c.ValueFormat) && format != relay.FormatCloudEventsBinary {
		return fmt.Errorf("sink.kafka.value_format %s needs envelope.format: cloudevents-binary (the value holds the payload; the envelope's attributes travel as ce_ headers), not %s", c.ValueFormat, format)
	}
	return nil
}

// Warnings names settings that work but expose a password or accept any
// broker or schema registry.
func (c *Config) Warnings() []string {
	var ws []string
	if c.SASL.Mechanism == SASLPlain && !c.TLSFiles.Enabled && c.TLS == nil {
		ws = append(ws, "sink.kafka.sasl.mechanism PLAIN without sink.kafka.tls sends the password unencrypted; enable sink.kafka.tls")
	}
	if c.TLSFiles.Enabled && c.TLSFiles.InsecureSkipVerify {
		ws = append(ws, "sink.kafka.tls.insecure_skip_verify accepts any broker certificate; use sink.kafka.tls.ca_file instead")
	}
	return append(ws, c.registryWarnings()...)
}

// mechanism returns the configured SASL mechanism, or nil for none.
// Validate has checked the mechanism's name.
func (s SASL) mechanism() sasl.Mechanism {
	switch s.Mechanism {
	case SASLPlain:
		return plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()
	case SASLScramSHA256:
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()
	}
	return nil
}

var (
	_ sinks.Settings  = (*Config)(nil)
	_ sinks.RelayOnly = (*Config)(nil)
)

// ForRelay returns c, with exactly_once and no transactional_id the
// [TransactionalID] of slot, so that relays on one slot share it.
func (c *Config) ForRelay(slot string) sinks.Settings {
	if !c.ExactlyOnce || c.TransactionalID != "" {
		return c
	}
	d := *c
	d.TransactionalID = TransactionalID(slot)
	return &d
}

// Detached returns c without exactly_once: a sink outside the relay does
// not hold its position.
func (c *Config) Detached() sinks.Settings {
	if !c.ExactlyOnce {
		return c
	}
	d := *c
	d.ExactlyOnce = false
	return &d
}

// ClientOpts are the franz-go options that reach the configured brokers
// (seed brokers, TLS, SASL), for tools that read what the sink wrote.
func (c *Config) ClientOpts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...)}
	tlsCfg := c.TLS
	if tlsCfg == nil && c.TLSFiles.Enabled {
		var err error
		if tlsCfg, err = c.TLSFiles.ClientConfig("sink.kafka.tls"); err != nil {
			return nil, err
		}
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if m := c.SASL.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// StaticDestinations: see sinks.StaticDestination.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.Topic) }
