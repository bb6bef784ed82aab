package awssink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied to zero fields of a [Common].
const (
	// DefaultMaxInFlight bounds the messages published and not yet
	// answered; Publish blocks beyond it.
	DefaultMaxInFlight = 10_000
	// DefaultBatchSize is the most messages in one batch request, the
	// most SQS and SNS take.
	DefaultBatchSize = 10
	// DefaultLinger is how long a batch of fewer waits for more.
	DefaultLinger = 5 * time.Millisecond
	// DefaultMaxConcurrentBatches is how many batches are sent at once.
	DefaultMaxConcurrentBatches = 16
	// DefaultMaxMessageBytes is the default maximum message size of SQS
	// and SNS, 256 KiB (body and attributes).
	DefaultMaxMessageBytes = 256 << 10
	// DefaultTimeout bounds one request.
	DefaultTimeout = 10 * time.Second
)

// Service is what the settings' messages say of the sink that embeds a
// [Common].
type Service struct {
	Name            string // the sink type, "sqs": keys are sink.sqs.*
	Title           string // "SQS"
	BatchCall       string // "SendMessageBatch"
	MaxMessageBytes int    // the most max_message_bytes may be
	MaxBytesText    string // that limit in words, "1 MiB"
	BatchDoc        string // what the reference adds to batch_size, or ""
}

// Common is the settings the sqs and sns sinks share, embedded in their
// Config with yaml:",inline". The zero value of every field means its
// default.
type Common struct {
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

	// BatchSize is the most messages in one batch request, 1 to 10,
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

// Defaults returns the settings a sink's section starts from.
func Defaults() Common {
	return Common{}.WithDefaults()
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Common) WithDefaults() Common {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Linger = cmp.Or(c.Linger, DefaultLinger)
	c.MaxConcurrentBatches = cmp.Or(c.MaxConcurrentBatches, DefaultMaxConcurrentBatches)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	return c
}

// Validate reports every problem with c (with its defaults applied), each
// one sentence naming the setting of s to fix.
func (c Common) Validate(s Service) []error {
	c = c.WithDefaults()
	k := "sink." + s.Name + "."
	var errs []error
	if c.AccessKeyID != "" && c.SecretAccessKey == "" && c.SecretAccessKeyFile == "" {
		errs = append(errs, fmt.Errorf("%saccess_key_id is set without %ssecret_access_key; set it, or %ssecret_access_key_file", k, k, k))
	}
	if c.AccessKeyID == "" && c.SecretAccessKey != "" {
		errs = append(errs, fmt.Errorf("%ssecret_access_key is set without %saccess_key_id; set both or neither", k, k))
	}
	if c.BatchSize < 1 || c.BatchSize > 10 {
		errs = append(errs, fmt.Errorf("%sbatch_size is %d; set it from 1 to 10, the most %s takes", k, c.BatchSize, s.BatchCall))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("%slinger is %v; set it to 0 or more", k, c.Linger))
	}
	if c.MaxConcurrentBatches < 1 {
		errs = append(errs, fmt.Errorf("%smax_concurrent_batches is %d; set it to 1 or more", k, c.MaxConcurrentBatches))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("%smax_inflight is %d; set it to 1 or more", k, c.MaxInFlight))
	}
	if c.MaxMessageBytes < 1024 || c.MaxMessageBytes > s.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("%smax_message_bytes is %d; set it from 1024 to %d, the most %s takes", k, c.MaxMessageBytes, s.MaxMessageBytes, s.Title))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%stimeout is %v; set it above 0", k, c.Timeout))
	}
	if c.TLS == nil && (c.TLSFiles.Enabled || c.TLSFiles.Configured()) {
		if _, err := c.TLSFiles.ClientConfig(k + "tls"); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// TLSConfig returns the TLS configuration of c: TLS, or the one TLSFiles
// describes, or nil for the system's defaults.
func (c Common) TLSConfig(s Service) (*tls.Config, error) {
	if c.TLS != nil {
		return c.TLS.Clone(), nil
	}
	if c.TLSFiles.Enabled || c.TLSFiles.Configured() {
		return c.TLSFiles.ClientConfig("sink." + s.Name + ".tls")
	}
	return nil, nil
}

// AWSConfig returns the AWS configuration of c (see [Client.Config]).
func (c Common) AWSConfig(s Service) (aws.Config, error) {
	tlsCfg, err := c.TLSConfig(s)
	if err != nil {
		return aws.Config{}, err
	}
	cfg, err := Client{
		Region: c.Region, Endpoint: c.Endpoint, AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey,
		SessionToken: c.SessionToken, Timeout: c.Timeout, TLS: tlsCfg,
	}.Config(context.Background())
	if err != nil {
		return aws.Config{}, fmt.Errorf("sink.%s: %w", s.Name, err)
	}
	return cfg, nil
}

// Docs returns the configuration reference's description of every key of
// [Common] in the section of s, with dest, the description of the
// destination key, under destKey.
func Docs(s Service, destKey, dest string) map[string]string {
	k := "sink." + s.Name + "."
	batch := "most messages in one `" + s.BatchCall + "`, 1 to 10, one of each aggregate"
	if s.BatchDoc != "" {
		batch += "; " + s.BatchDoc
	}
	return map[string]string{
		destKey:                    dest,
		"region":                   "AWS region (default: `AWS_REGION`, the shared configuration)",
		"endpoint":                 "endpoint URL replacing the service's (a VPC endpoint, an emulator)",
		"access_key_id":            "static credentials; without it the SDK's default chain (environment, shared files, web identity, instance role)",
		"secret_access_key":        "secret of `" + k + "access_key_id`",
		"secret_access_key_file":   "file holding `" + k + "secret_access_key`",
		"session_token":            "session token of temporary credentials",
		"session_token_file":       "file holding `" + k + "session_token`",
		"batch_size":               batch,
		"linger":                   "how long a batch of fewer waits for more messages",
		"max_concurrent_batches":   "batches sent at once",
		"max_inflight":             "messages published and not yet answered; Publish blocks beyond it",
		"max_message_bytes":        "largest message, body and attributes, up to " + s.MaxBytesText + "; a larger one is dead-lettered",
		"timeout":                  "bound of one request",
		"tls.enabled":              "use the TLS settings below",
		"tls.ca_file":              "CA bundle that signs the endpoint's certificate",
		"tls.cert_file":            "client certificate (mutual TLS)",
		"tls.key_file":             "client key (mutual TLS)",
		"tls.server_name":          "name to verify in the endpoint's certificate",
		"tls.insecure_skip_verify": "skip certificate verification (tests only)",
	}
}

// Warnings names the shared settings of s that leave the endpoint
// unverified.
func (c Common) Warnings(s Service) []string {
	if c.TLSFiles.InsecureSkipVerify {
		k := "sink." + s.Name + "."
		return []string{k + "tls.insecure_skip_verify accepts any endpoint certificate; use " + k + "tls.ca_file instead"}
	}
	return nil
}

// Join is errors.Join of first, when not nil, and rest.
func Join(first error, rest []error) error {
	if first != nil {
		rest = append([]error{first}, rest...)
	}
	return errors.Join(rest...)
}
