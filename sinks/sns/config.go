package sns

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	// DefaultMaxInFlight bounds the messages published and not yet
	// answered; Publish blocks beyond it.
	DefaultMaxInFlight = 10_000
	// DefaultBatchSize is the most messages in one PublishBatch, the most
	// SNS takes.
	DefaultBatchSize = 10
	// DefaultLinger is how long a batch of fewer waits for more.
	DefaultLinger = 5 * time.Millisecond
	// DefaultMaxConcurrentBatches is how many batches are sent at once.
	DefaultMaxConcurrentBatches = 16
	// DefaultMaxMessageBytes is SNS's maximum message size, 256 KiB (body
	// and attributes).
	DefaultMaxMessageBytes = 256 << 10
	// DefaultTimeout bounds one request.
	DefaultTimeout = 10 * time.Second
)

// MaxMessageBytesLimit is the largest message SNS accepts, 256 KiB.
const MaxMessageBytesLimit = 256 << 10

// Config configures an SNS [Sink]. The zero value of every field means its
// default; TopicARN is required.
type Config struct {
	// TopicARN is the topic's ARN, or a template of it whose placeholders
	// ({aggregate_type}, {event_type}, {table}) stand only in the topic
	// name, after the last colon. A name ending in .fifo is a FIFO topic.
	TopicARN string `yaml:"topic_arn"`
	// Region is the AWS region; empty means AWS_REGION and the shared
	// configuration.
	Region string `yaml:"region"`
	// Endpoint replaces the service's endpoint (a VPC endpoint, an
	// emulator).
	Endpoint string `yaml:"endpoint"`
	// AccessKeyID, SecretAccessKey and SessionToken are static
	// credentials; without AccessKeyID the SDK's default chain is used
	// (environment, shared files, web identity, instance role).
	AccessKeyID         string `yaml:"access_key_id"`
	SecretAccessKey     string `yaml:"secret_access_key" secret:"text"`
	SecretAccessKeyFile string `yaml:"secret_access_key_file"`
	SessionToken        string `yaml:"session_token" secret:"text"`
	SessionTokenFile    string `yaml:"session_token_file"`

	// BatchSize is the most messages in one PublishBatch, 1 to 10,
	// default [DefaultBatchSize]; 1 sends each message with Publish. A
	// batch holds one message of each of distinct aggregates.
	BatchSize int `yaml:"batch_size"`
	// Linger is how long a batch of fewer than BatchSize waits for more
	// messages, default [DefaultLinger].
	Linger time.Duration `yaml:"linger"`
	// MaxConcurrentBatches is how many batches are sent at once, default
	// [DefaultMaxConcurrentBatches].
	MaxConcurrentBatches int `yaml:"max_concurrent_batches"`
	// MaxInFlight bounds the messages published and not yet answered,
	// default [DefaultMaxInFlight].
	MaxInFlight int `yaml:"max_inflight"`
	// MaxMessageBytes is the largest message sent, body and attributes,
	// default [DefaultMaxMessageBytes]; a larger one is dead-lettered.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Timeout bounds one request, default [DefaultTimeout].
	Timeout time.Duration `yaml:"timeout"`

	// TLSFiles is the file form of TLS, for an endpoint behind a private
	// CA.
	TLSFiles sinks.TLS `yaml:"tls"`
	// TLS, when set, is used instead of TLSFiles.
	TLS *tls.Config `yaml:"-"`
}

func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Linger = cmp.Or(c.Linger, DefaultLinger)
	c.MaxConcurrentBatches = cmp.Or(c.MaxConcurrentBatches, DefaultMaxConcurrentBatches)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	return c
}

// Validate reports every problem with c, each one sentence naming the
// setting to fix.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if _, err := parseTopicARN(c.TopicARN); err != nil {
		errs = append(errs, fmt.Errorf("sink.sns.topic_arn: %w", err))
	}
	if c.AccessKeyID != "" && c.SecretAccessKey == "" && c.SecretAccessKeyFile == "" {
		errs = append(errs, errors.New("sink.sns.access_key_id is set without sink.sns.secret_access_key; set it, or sink.sns.secret_access_key_file"))
	}
	if c.AccessKeyID == "" && c.SecretAccessKey != "" {
		errs = append(errs, errors.New("sink.sns.secret_access_key is set without sink.sns.access_key_id; set both or neither"))
	}
	if c.BatchSize < 1 || c.BatchSize > 10 {
		errs = append(errs, fmt.Errorf("sink.sns.batch_size is %d; set it from 1 to 10, the most PublishBatch takes", c.BatchSize))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("sink.sns.linger is %v; set it to 0 or more", c.Linger))
	}
	if c.MaxConcurrentBatches < 1 {
		errs = append(errs, fmt.Errorf("sink.sns.max_concurrent_batches is %d; set it to 1 or more", c.MaxConcurrentBatches))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("sink.sns.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	if c.MaxMessageBytes < 1024 || c.MaxMessageBytes > MaxMessageBytesLimit {
		errs = append(errs, fmt.Errorf("sink.sns.max_message_bytes is %d; set it from 1024 to %d, the most SNS takes", c.MaxMessageBytes, MaxMessageBytesLimit))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("sink.sns.timeout is %v; set it above 0", c.Timeout))
	}
	if c.TLS == nil && (c.TLSFiles.Enabled || c.TLSFiles.Configured()) {
		if _, err := c.TLSFiles.ClientConfig("sink.sns.tls"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c Config) tlsConfig() (*tls.Config, error) {
	if c.TLS != nil {
		return c.TLS.Clone(), nil
	}
	if c.TLSFiles.Enabled || c.TLSFiles.Configured() {
		return c.TLSFiles.ClientConfig("sink.sns.tls")
	}
	return nil, nil
}

// parseTopicARN parses the topic ARN template: arn:<partition>:sns:
// <region>:<account>:<name>, placeholders only in the name.
func parseTopicARN(s string) (route.Template, error) {
	if s == "" {
		return route.Template{}, errors.New("is empty; set it to the topic's ARN, arn:aws:sns:<region>:<account>:<name>")
	}
	if parts := strings.Split(s, ":"); len(parts) != 6 || parts[0] != "arn" || parts[2] != "sns" {
		return route.Template{}, fmt.Errorf("%q is not an SNS topic ARN, arn:aws:sns:<region>:<account>:<name>", s)
	}
	t, err := route.Parse(s)
	if err != nil {
		return route.Template{}, err
	}
	if i := strings.IndexByte(s, '{'); i >= 0 && i < strings.LastIndexByte(s, ':') {
		return route.Template{}, fmt.Errorf("%q has a placeholder outside the topic name, after the last colon", s)
	}
	return t, nil
}

// checkTopicName reports why the topic name of a rendered ARN is not one
// SNS allows: 1 to 256 letters, digits, - and _, and .fifo for a FIFO
// topic.
func checkTopicName(arn string) error {
	name := arn[strings.LastIndexByte(arn, ':')+1:]
	base := strings.TrimSuffix(name, ".fifo")
	ok := base != "" && len(name) <= 256
	for i := 0; ok && i < len(base); i++ {
		c := base[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("topic name %q is not one SNS allows (1 to 256 letters, digits, - and _, then .fifo for a FIFO topic); change the row's values or sink.sns.topic_arn", name)
	}
	return nil
}
