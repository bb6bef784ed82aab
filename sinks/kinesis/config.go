package kinesis

import (
	"cmp"
	"fmt"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	// DefaultTimeout bounds one PutRecords call and the probe of Connect.
	DefaultTimeout = awssink.DefaultTimeout
	// DefaultMaxInFlight bounds the messages queued or in flight; Publish
	// blocks beyond it.
	DefaultMaxInFlight = 10_000
	// DefaultMaxRequests is the most PutRecords calls at once.
	DefaultMaxRequests = 4
	// DefaultRecordAttempts is how often the sink puts a record that
	// Kinesis refused in a PutRecords answer (throughput exceeded, an
	// internal failure) before it reports the failure to the relay.
	DefaultRecordAttempts = 3
)

// Config configures a Kinesis [Sink]. The zero value of every field means
// its default; Stream is required.
type Config struct {
	// Stream is the template of the stream name: {aggregate_type},
	// {event_type} and {table} are replaced by the message's values.
	Stream string `yaml:"stream"`
	// Connection is the settings every AWS sink has: region (empty:
	// AWS_REGION), endpoint (a VPC endpoint, kinesalite, LocalStack),
	// static credentials with a session token (else the SDK's default
	// chain), the bound of one call (default [DefaultTimeout]) and TLS.
	awssink.Connection `yaml:",inline"`
	// MaxInFlight bounds the messages queued or in flight, default
	// [DefaultMaxInFlight].
	MaxInFlight int `yaml:"max_inflight"`
	// MaxRequests is the most PutRecords calls at once, default
	// [DefaultMaxRequests].
	MaxRequests int `yaml:"max_requests"`
	// RecordAttempts is how often a record refused in a PutRecords answer
	// is put before the relay is told, default [DefaultRecordAttempts].
	RecordAttempts int `yaml:"record_attempts"`
}

// service is what the shared settings' messages say of this sink.
var service = awssink.Service{Name: "kinesis", Title: "Kinesis"}

func (c Config) withDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxRequests = cmp.Or(c.MaxRequests, DefaultMaxRequests)
	c.RecordAttempts = cmp.Or(c.RecordAttempts, DefaultRecordAttempts)
	return c
}

// Validate reports every problem with c, each one sentence naming the
// setting to fix.
func (c Config) Validate() error {
	c = c.withDefaults()
	var first error
	if _, err := parseStream(c.Stream); err != nil {
		first = fmt.Errorf("sink.kinesis.stream: %w", err)
	}
	errs := c.Connection.Validate(service)
	for _, n := range []struct {
		key string
		v   int
	}{{"max_inflight", c.MaxInFlight}, {"max_requests", c.MaxRequests}, {"record_attempts", c.RecordAttempts}} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("sink.kinesis.%s is %d; set it to 1 or more", n.key, n.v))
		}
	}
	return awssink.Join(first, errs)
}

// CheckFormat refuses the envelope formats that carry part of a message in
// headers: a Kinesis record has none.
func (c *Config) CheckFormat(format relay.Format) error {
	switch format {
	case relay.FormatCloudEventsBinary, relay.FormatDebezium:
		return fmt.Errorf("envelope.format %s puts part of each message in headers, and a Kinesis record carries none; with sink.type kinesis use envelope.format envelope or cloudevents, which hold everything in the record", format)
	}
	return nil
}
