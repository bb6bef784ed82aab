package kafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	// DefaultTopic routes every aggregate type to its own topic.
	DefaultTopic = "outbox.{aggregate_type}"

	// DefaultLinger is zero: a partition's batch is sent as soon as the
	// connection can take it. The relay's latency budget is a p99
	// commit-to-ack under 20 ms at 1,000 rows/s. Spread over the topics and
	// partitions of the aggregates, that rate puts only a few records into
	// any partition's linger window, so lingering adds its full duration to
	// most records while saving almost no requests; acks=all already spends
	// part of the budget on replication. Batching does not depend on
	// lingering: while a produce request is in flight, records accumulate
	// and go out together in the next one, so throughput under load is kept
	// (see BenchmarkProduce and BenchmarkLatency).
	DefaultLinger time.Duration = 0

	// DefaultMaxInFlight bounds the records produced but not yet
	// acknowledged; Publish blocks beyond it. About 10 MB of 1 KB
	// envelopes, and several seconds of backlog at 1,000 rows/s.
	DefaultMaxInFlight = 10_000

	// DefaultMaxMessageBytes is under Kafka's default message.max.bytes
	// (1,048,588) for brokers and topics.
	DefaultMaxMessageBytes = 1_000_000

	// DefaultClientID identifies the relay in broker logs and quotas.
	DefaultClientID = "outboxrelay"

	// DefaultDialTimeout is franz-go's default.
	DefaultDialTimeout = 10 * time.Second

	// DefaultCompression is none. Only none and gzip are read by every
	// stock Kafka client without a plugin (kafkajs ships gzip only; snappy,
	// lz4 and zstd need codec packages there), and gzip tripled the relay's
	// CPU per row in make bench (0.97 to 2.88 CPU s per 100k 1 KB rows) and
	// cut the drain from the decode ceiling to 0.36 of it. Operators who
	// want smaller batches choose gzip, or zstd/lz4 when every consumer
	// reads them; BenchmarkCompression and the README give the figures.
	DefaultCompression = CompressionNone

	// DefaultPositionsTopic is the compacted topic of exactly-once mode's
	// positions, one record per transactional.id and Kafka transaction.
	DefaultPositionsTopic = "__outboxrelay_positions"

	// DefaultMaxTxnRecords bounds a Kafka transaction of exactly-once mode.
	DefaultMaxTxnRecords = 10_000
)

// Compression codecs of Config.Compression.
const (
	CompressionNone   = "none"
	CompressionGzip   = "gzip"
	CompressionSnappy = "snappy"
	CompressionLZ4    = "lz4"
	CompressionZstd   = "zstd"
)

// SASL authenticates the Kafka client (sink.kafka.sasl).
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty disables SASL.
	Mechanism    string `yaml:"mechanism"`
	Username     string `yaml:"username"`
	Password     string `yaml:"password" secret:"text"`
	PasswordFile string `yaml:"password_file"`
}

// SASL mechanisms of SASL.Mechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Config configures a Kafka [Sink]. The zero value of every field but
// Brokers means its default.
type Config struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string `yaml:"brokers"`

	// Topic is the topic template, default [DefaultTopic]. The placeholders
	// {aggregate_type}, {event_type} and {table} are replaced by the
	// message's fields (table as schema.name, empty for a table-less
	// message); any other placeholder is a configuration error.
	//
	// A rendered topic must be a legal Kafka topic name: 1 to 249
	// characters of [a-zA-Z0-9._-], neither "." nor "..". A message whose
	// topic is not is reported through done as relay.Permanent without
	// being produced, and the relay dead-letters it; later messages are
	// not affected. Literal text of the template is checked by Validate.
	Topic string `yaml:"topic"`

	// Linger is how long a partition waits for more records before its
	// batch is sent, default [DefaultLinger] (no wait). Raising it trades
	// latency for fewer, larger requests.
	Linger time.Duration `yaml:"linger"`

	// MaxInFlight is the number of records produced but not yet
	// acknowledged beyond which Publish blocks, default
	// [DefaultMaxInFlight].
	MaxInFlight int `yaml:"-"`

	// MaxMessageBytes is the largest record batch the sink sends,
	// uncompressed, default [DefaultMaxMessageBytes]. A record that does not
	// fit on its own fails with MESSAGE_TOO_LARGE, permanently, without
	// affecting other records. Keep it at or below the max.message.bytes of
	// every topic: a batch the broker rejects as too large fails every
	// record then buffered for that partition, and all of them are reported
	// as permanent failures.
	MaxMessageBytes int `yaml:"-"`

	// ClientID is the Kafka client.id, default [DefaultClientID].
	ClientID string `yaml:"-"`

	// DialTimeout bounds each connection attempt, default
	// [DefaultDialTimeout].
	DialTimeout time.Duration `yaml:"-"`

	// Compression is the codec of produced batches: none, gzip, snappy,
	// lz4 or zstd, default [DefaultCompression]. Every consumer must
	// support the codec to read the records.
	Compression string `yaml:"compression"`

	// TLSFiles is the file form of TLS: when TLS is nil and
	// TLSFiles.Enabled is set, New builds TLS from its files.
	TLSFiles sinks.TLS `yaml:"tls"`

	// SASL authenticates the client; no mechanism disables it.
	SASL SASL `yaml:"sasl"`

	// TLS, when set, makes every broker connection use TLS.
	TLS *tls.Config `yaml:"-"`

	// ExactlyOnce makes the sink transactional (see [TxnSink]): each Kafka
	// transaction holds whole source transactions together with the
	// position they reach, and a consumer with isolation.level
	// read_committed sees every message once.
	ExactlyOnce bool `yaml:"exactly_once"`

	// TransactionalID is the Kafka transactional.id of exactly-once mode.
	// Empty: the command derives it from postgres.slot ([TransactionalID]),
	// so that relays on one slot share it and a standby that takes over
	// fences off the relay it replaces.
	TransactionalID string `yaml:"transactional_id"`

	// PositionsTopic holds the positions of exactly-once mode, default
	// [DefaultPositionsTopic].
	PositionsTopic string `yaml:"-"`

	// MaxTxnRecords bounds the records of one Kafka transaction, default
	// [DefaultMaxTxnRecords]; a source transaction is never split.
	MaxTxnRecords int `yaml:"-"`

	// ValueFormat is what a record value holds, default [ValueJSON] (the
	// relay's body). With [ValueConfluentJSONSchema] or [ValueConfluentAvro]
	// the value is the payload in the Confluent wire format (a zero byte,
	// the schema's registry id as 4 bytes big-endian, then the JSON or Avro
	// binary payload) and the envelope's attributes travel as headers, as in
	// envelope.format cloudevents-binary, which these formats need.
	ValueFormat string `yaml:"value_format"`

	// SchemasDir is the schema folder of a Confluent value format: the
	// JSON Schemas (order.created/v1.json) for confluent-json-schema, their
	// Avro forms beside them (order.created/v1.avsc) for confluent-avro.
	SchemasDir string `yaml:"schemas_dir"`

	// SchemaRegistry is the registry of a Confluent value format.
	SchemaRegistry SchemaRegistry `yaml:"schema_registry"`

	// Opts are extra franz-go options, applied after the sink's own (SASL,
	// for example). Options that disable idempotence, lower the acks or
	// bound retries void the ordering and delivery guarantees of the sink.
	Opts []kgo.Opt `yaml:"-"`
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Compression == "" {
		c.Compression = DefaultCompression
	}
	if c.PositionsTopic == "" {
		c.PositionsTopic = DefaultPositionsTopic
	}
	if c.MaxTxnRecords <= 0 {
		c.MaxTxnRecords = DefaultMaxTxnRecords
	}
	if c.ValueFormat == "" {
		c.ValueFormat = ValueJSON
	}
	if c.SchemaRegistry.SubjectStrategy == "" {
		c.SchemaRegistry.SubjectStrategy = SubjectTopic
	}
	return c
}

// Validate reports every problem with c, with zero fields standing for their
// defaults. Each problem is one sentence naming the setting to fix.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("sink.kafka.brokers is empty; list at least one broker as host:port"))
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" || strings.ContainsAny(b, " \t\n/") {
			errs = append(errs, fmt.Errorf("sink.kafka.brokers has %q, which is not a host:port", b))
		}
	}
	if _, err := parseTemplate(c.Topic, c.PositionsTopic); err != nil {
		errs = append(errs, fmt.Errorf("sink.kafka.topic: %w", err))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("sink.kafka.linger is %v; set it to 0 or more", c.Linger))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("sink.kafka.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	if c.MaxMessageBytes < 512 || c.MaxMessageBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("sink.kafka.max_message_bytes is %d; set it between 512 and %d", c.MaxMessageBytes, 1<<30))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("sink.kafka.dial_timeout is %v; set it above 0", c.DialTimeout))
	}
	if _, err := codec(c.Compression); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateSecurity()...)
	errs = append(errs, c.validateValues()...)
	return errors.Join(errs...)
}

// codec returns the franz-go codec of a Compression name.
func codec(name string) (kgo.CompressionCodec, error) {
	switch name {
	case CompressionNone:
		return kgo.NoCompression(), nil
	case CompressionGzip:
		return kgo.GzipCompression(), nil
	case CompressionSnappy:
		return kgo.SnappyCompression(), nil
	case CompressionLZ4:
		return kgo.Lz4Compression(), nil
	case CompressionZstd:
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("sink.kafka.compression %q is not one of none, gzip, snappy, lz4, zstd", name)
}

func (c Config) validateSecurity() []error {
	var errs []error
	if c.TLSFiles.Configured() && !c.TLSFiles.Enabled {
		errs = append(errs, errors.New("sink.kafka.tls has settings but sink.kafka.tls.enabled is false; set sink.kafka.tls.enabled: true"))
	}
	if c.TLSFiles.Enabled {
		if _, err := c.TLSFiles.ClientConfig("sink.kafka.tls"); err != nil {
			errs = append(errs, err)
		}
	}
	s := c.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" {
			errs = append(errs, errors.New("sink.kafka.sasl has a username or password but no mechanism; set sink.kafka.sasl.mechanism to PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"))
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.Username == "" {
			errs = append(errs, fmt.Errorf("sink.kafka.sasl.username is required for %s", s.Mechanism))
		}
		if s.Password == "" {
			errs = append(errs, fmt.Errorf("sink.kafka.sasl.password (or password_file) is required for %s", s.Mechanism))
		}
	default:
		errs = append(errs, fmt.Errorf("sink.kafka.sasl.mechanism %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.Mechanism))
	}
	return errs
}
