package kinesis

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	// DefaultTimeout bounds one PutRecords call and the probe of Connect.
	DefaultTimeout = 10 * time.Second
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
// its default; Stream and Region are required.
type Config struct {
	// Stream is the template of the stream name: {aggregate_type},
	// {event_type} and {table} are replaced by the message's values.
	Stream string `yaml:"stream"`
	// Region is the AWS region of the streams.
	Region string `yaml:"region"`
	// Endpoint overrides the Kinesis endpoint URL (a VPC endpoint,
	// kinesalite, LocalStack).
	Endpoint string `yaml:"endpoint"`
	// AccessKeyID and SecretAccessKey, when set, are the credentials;
	// otherwise the SDK's default chain finds them (AWS_ACCESS_KEY_ID,
	// the shared files, a web identity, the instance's role).
	AccessKeyID         string `yaml:"access_key_id"`
	SecretAccessKey     string `yaml:"secret_access_key" secret:"text"`
	SecretAccessKeyFile string `yaml:"secret_access_key_file"`
	// Timeout bounds one PutRecords call, default [DefaultTimeout].
	Timeout time.Duration `yaml:"timeout"`
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

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxRequests = cmp.Or(c.MaxRequests, DefaultMaxRequests)
	c.RecordAttempts = cmp.Or(c.RecordAttempts, DefaultRecordAttempts)
	return c
}

// Validate reports every problem with c, each one sentence naming the
// setting to fix.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if _, err := parseStream(c.Stream); err != nil {
		errs = append(errs, fmt.Errorf("sink.kinesis.stream: %w", err))
	}
	if c.Region == "" {
		errs = append(errs, errors.New("sink.kinesis.region is empty; set it to the AWS region of the stream, for example eu-west-1"))
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("sink.kinesis.endpoint %q is not an http:// or https:// URL", c.Endpoint))
		}
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "" && c.SecretAccessKeyFile == "") {
		errs = append(errs, errors.New("sink.kinesis.access_key_id and sink.kinesis.secret_access_key are set one without the other; set both, or neither for the default credential chain"))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("sink.kinesis.timeout is %v; set it above 0", c.Timeout))
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"max_inflight", c.MaxInFlight}, {"max_requests", c.MaxRequests}, {"record_attempts", c.RecordAttempts}} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("sink.kinesis.%s is %d; set it to 1 or more", n.key, n.v))
		}
	}
	return errors.Join(errs...)
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
