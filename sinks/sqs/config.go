package sqs

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
	// DefaultBatchSize is the most messages in one SendMessageBatch, the
	// most SQS takes.
	DefaultBatchSize = 10
	// DefaultLinger is how long a batch of fewer waits for more.
	DefaultLinger = 5 * time.Millisecond
	// DefaultMaxConcurrentBatches is how many batches are sent at once.
	DefaultMaxConcurrentBatches = 16
	// DefaultMaxMessageBytes is SQS's default maximum message size, 256 KiB
	// (body and attributes); a queue may allow up to 1 MiB.
	DefaultMaxMessageBytes = 256 << 10
	// DefaultTimeout bounds one request.
	DefaultTimeout = 10 * time.Second
)

// MaxMessageBytesLimit is the largest message SQS accepts, 1 MiB.
const MaxMessageBytesLimit = 1 << 20

// Config configures an SQS [Sink]. The zero value of every field means its
// default; QueueURL is required.
type Config struct {
	// QueueURL is the queue's URL, or a template of it whose placeholders
	// ({aggregate_type}, {event_type}, {table}) stand only in the queue
	// name, its last path segment. A name ending in .fifo is a FIFO queue.
	QueueURL string `yaml:"queue_url"`
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

	// BatchSize is the most messages in one SendMessageBatch, 1 to 10,
	// default [DefaultBatchSize]. A batch holds one message of each of
	// distinct aggregates.
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
	if _, err := parseQueueURL(c.QueueURL); err != nil {
		errs = append(errs, fmt.Errorf("sink.sqs.queue_url: %w", err))
	}
	if c.AccessKeyID != "" && c.SecretAccessKey == "" && c.SecretAccessKeyFile == "" {
		errs = append(errs, errors.New("sink.sqs.access_key_id is set without sink.sqs.secret_access_key; set it, or sink.sqs.secret_access_key_file"))
	}
	if c.AccessKeyID == "" && c.SecretAccessKey != "" {
		errs = append(errs, errors.New("sink.sqs.secret_access_key is set without sink.sqs.access_key_id; set both or neither"))
	}
	if c.BatchSize < 1 || c.BatchSize > 10 {
		errs = append(errs, fmt.Errorf("sink.sqs.batch_size is %d; set it from 1 to 10, the most SendMessageBatch takes", c.BatchSize))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("sink.sqs.linger is %v; set it to 0 or more", c.Linger))
	}
	if c.MaxConcurrentBatches < 1 {
		errs = append(errs, fmt.Errorf("sink.sqs.max_concurrent_batches is %d; set it to 1 or more", c.MaxConcurrentBatches))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("sink.sqs.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	if c.MaxMessageBytes < 1024 || c.MaxMessageBytes > MaxMessageBytesLimit {
		errs = append(errs, fmt.Errorf("sink.sqs.max_message_bytes is %d; set it from 1024 to %d, the most SQS takes", c.MaxMessageBytes, MaxMessageBytesLimit))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("sink.sqs.timeout is %v; set it above 0", c.Timeout))
	}
	if c.TLS == nil && (c.TLSFiles.Enabled || c.TLSFiles.Configured()) {
		if _, err := c.TLSFiles.ClientConfig("sink.sqs.tls"); err != nil {
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
		return c.TLSFiles.ClientConfig("sink.sqs.tls")
	}
	return nil, nil
}

// parseQueueURL parses the queue URL template: an http(s) URL whose
// placeholders stand only in its last path segment, the queue name.
func parseQueueURL(s string) (route.Template, error) {
	if s == "" {
		return route.Template{}, errors.New("is empty; set it to the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<name>")
	}
	if !strings.HasPrefix(s, "https://") && !strings.HasPrefix(s, "http://") {
		return route.Template{}, fmt.Errorf("%q is not an http:// or https:// URL", s)
	}
	t, err := route.Parse(s)
	if err != nil {
		return route.Template{}, err
	}
	if i := strings.IndexByte(s, '{'); i >= 0 && i < strings.LastIndexByte(s, '/') {
		return route.Template{}, fmt.Errorf("%q has a placeholder outside the queue name, its last path segment", s)
	}
	return t, nil
}

// checkQueueName reports why the queue name of a rendered URL is not one
// SQS allows: 1 to 80 letters, digits, - and _, and .fifo for a FIFO queue.
func checkQueueName(u string) error {
	name := u[strings.LastIndexByte(u, '/')+1:]
	base := strings.TrimSuffix(name, ".fifo")
	ok := base != "" && len(name) <= 80
	for i := 0; ok && i < len(base); i++ {
		c := base[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("queue name %q is not one SQS allows (1 to 80 letters, digits, - and _, then .fifo for a FIFO queue); change the row's values or sink.sqs.queue_url", name)
	}
	return nil
}
