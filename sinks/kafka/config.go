package kafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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

	// DefaultMaxBufferedRecords bounds the records produced but not yet
	// acknowledged; Publish blocks beyond it. About 10 MB of 1 KB
	// envelopes, and several seconds of backlog at 1,000 rows/s.
	DefaultMaxBufferedRecords = 10_000

	// DefaultMaxMessageBytes is under Kafka's default message.max.bytes
	// (1,048,588) for brokers and topics.
	DefaultMaxMessageBytes = 1_000_000

	// DefaultClientID identifies the relay in broker logs and quotas.
	DefaultClientID = "outboxrelay"

	// DefaultDialTimeout is franz-go's default.
	DefaultDialTimeout = 10 * time.Second
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

	// MaxBufferedRecords is the number of records produced but not yet
	// acknowledged beyond which Publish blocks, default
	// [DefaultMaxBufferedRecords].
	MaxBufferedRecords int `yaml:"max_buffered_records"`

	// MaxMessageBytes is the largest record batch the sink sends,
	// uncompressed, default [DefaultMaxMessageBytes]. A record that does not
	// fit on its own fails with MESSAGE_TOO_LARGE, permanently, without
	// affecting other records. Keep it at or below the max.message.bytes of
	// every topic: a batch the broker rejects as too large fails every
	// record then buffered for that partition, and all of them are reported
	// as permanent failures.
	MaxMessageBytes int `yaml:"max_message_bytes"`

	// ClientID is the Kafka client.id, default [DefaultClientID].
	ClientID string `yaml:"client_id"`

	// DialTimeout bounds each connection attempt, default
	// [DefaultDialTimeout].
	DialTimeout time.Duration `yaml:"dial_timeout"`

	// TLS, when set, makes every broker connection use TLS.
	TLS *tls.Config `yaml:"-"`

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
	if c.MaxBufferedRecords == 0 {
		c.MaxBufferedRecords = DefaultMaxBufferedRecords
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
	if _, err := parseTemplate(c.Topic); err != nil {
		errs = append(errs, fmt.Errorf("sink.kafka.topic: %w", err))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("sink.kafka.linger is %v; set it to 0 or more", c.Linger))
	}
	if c.MaxBufferedRecords < 0 {
		errs = append(errs, fmt.Errorf("sink.kafka.max_buffered_records is %d; set it to 1 or more", c.MaxBufferedRecords))
	}
	if c.MaxMessageBytes < 512 || c.MaxMessageBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("sink.kafka.max_message_bytes is %d; set it between 512 and %d", c.MaxMessageBytes, 1<<30))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("sink.kafka.dial_timeout is %v; set it above 0", c.DialTimeout))
	}
	return errors.Join(errs...)
}
