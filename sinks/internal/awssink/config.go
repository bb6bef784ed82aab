package awssink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied to zero fields of a [Common] (DefaultTimeout: of a
// [Connection]).
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
// [Connection] or a [Common].
type Service struct {
	Name            string // the sink type, "sqs": keys are sink.sqs.*
	Title           string // "SQS"
	BatchCall       string // "SendMessageBatch"; a Connection alone needs none
	MaxMessageBytes int    // the most max_message_bytes may be
	MaxBytesText    string // that limit in words, "1 MiB"
	BatchDoc        string // what the reference adds to batch_size, or ""
}

// key is the full name of the key k of s's section.
func (s Service) key(k string) string { return "sink." + s.Name + "." + k }

// Connection is the settings every AWS sink has (sqs, sns, kinesis): the
// service's region and endpoint, the credentials, the bound of one
// request and TLS. A sink's Config embeds it (through [Common] or
// directly) with yaml:",inline", so that the keys, their defaults, checks,
// secrets from files and documentation are the same in every section. The
// zero value of every field means its default.
type Connection struct {
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
	// Timeout bounds one request, default [DefaultTimeout].
	Timeout time.Duration `yaml:"timeout"`

	// TLSFiles is the file form of TLS, for an endpoint behind a private
	// CA.
	TLSFiles sinks.TLS `yaml:"tls"`
	// TLS, when set, is used instead of TLSFiles.
	TLS *tls.Config `yaml:"-"`
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Connection) WithDefaults() Connection {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	return c
}

// Validate reports every problem with c (with its defaults applied), each
// one sentence naming the setting of s to fix.
func (c Connection) Validate(s Service) []error {
	c = c.WithDefaults()
	var errs []error
	if c.AccessKeyID != "" && c.SecretAccessKey == "" && c.SecretAccessKeyFile == "" {
		errs = append(errs, fmt.Errorf("%s is set without %s; set it, or %s", s.key("access_key_id"), s.key("secret_access_key"), s.key("secret_access_key_file")))
	}
	if c.AccessKeyID == "" && c.SecretAccessKey != "" {
		errs = append(errs, fmt.Errorf("%s is set without %s; set both or neither", s.key("secret_access_key"), s.key("access_key_id")))
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s %q is not an http:// or https:// URL", s.key("endpoint"), c.Endpoint))
		}
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%s is %v; set it above 0", s.key("timeout"), c.Timeout))
	}
	if c.TLS == nil && (c.TLSFiles.Enabled || c.TLSFiles.Configured()) {
		if _, err := c.TLSFiles.ClientConfig(s.key("tls")); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// TLSConfig returns the TLS configuration of c: TLS, or the one TLSFiles
// describes, or nil for the system's defaults.
func (c Connection) TLSConfig(s Service) (*tls.Config, error) {
	if c.TLS != nil {
		return c.TLS.Clone(), nil
	}
	if c.TLSFiles.Enabled || c.TLSFiles.Configured() {
		return c.TLSFiles.ClientConfig(s.key("tls"))
	}
	return nil, nil
}

// AWSConfig returns the AWS configuration of c (see [Client.Config]).
func (c Connection) AWSConfig(s Service) (aws.Config, error) {
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

// ConnectionDocs returns the configuration reference's description of
// every key of [Connection] in the section of s.
func ConnectionDocs(s Service) map[string]string {
	return map[string]string{
		"region":                   "AWS region (default: `AWS_REGION`, the shared configuration)",
		"endpoint":                 "endpoint URL replacing the service's (a VPC endpoint, an emulator)",
		"access_key_id":            "static credentials; without it the SDK's default chain (environment, shared files, web identity, instance role)",
		"secret_access_key":        "secret of `" + s.key("access_key_id") + "`",
		"secret_access_key_file":   "file holding `" + s.key("secret_access_key") + "`",
		"session_token":            "session token of temporary credentials",
		"session_token_file":       "file holding `" + s.key("session_token") + "`",
		"timeout":                  "bound of one request",
		"tls.enabled":              "use the TLS settings below",
		"tls.ca_file":              "CA bundle that signs the endpoint's certificate",
		"tls.cert_file":            "client certificate (mutual TLS)",
		"tls.key_file":             "client key (mutual TLS)",
		"tls.server_name":          "name to verify in the endpoint's certificate",
		"tls.insecure_skip_verify": "skip certificate verification (tests only)",
	}
}

// Warnings names the settings of c that leave the endpoint unverified or
// send signed requests unencrypted to another host.
func (c Connection) Warnings(s Service) []string {
	var ws []string
	if c.TLSFiles.InsecureSkipVerify {
		ws = append(ws, s.key("tls.insecure_skip_verify")+" accepts any endpoint certificate; use "+s.key("tls.ca_file")+" instead")
	}
	if u, err := url.Parse(c.Endpoint); err == nil && u.Scheme == "http" && c.AccessKeyID != "" && !loopback(u.Hostname()) {
		ws = append(ws, s.key("endpoint")+" is http:// and sends signed requests unencrypted; use https://")
	}
	return ws
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Common is the settings the sqs and sns sinks share: a [Connection] and
// the batching of their batch calls, embedded in their Config with
// yaml:",inline". The zero value of every field means its default.
type Common struct {
	Connection `yaml:",inline"`

	// BatchSize is the most messages in one batch request, 1 to 10,
	// default [DefaultBatchSize]. A batch holds one message of each of
	// distinct aggregates.
	BatchSize int `yaml:"batch_size"`
	// Linger is the longest a batch of fewer than BatchSize waits for more
	// messages, default [DefaultLinger]; it waits only while another batch
	// is in flight (see package batch).
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
}

// Defaults returns the settings a sink's section starts from.
func Defaults() Common {
	return Common{}.WithDefaults()
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Common) WithDefaults() Common {
	c.Connection = c.Connection.WithDefaults()
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Linger = cmp.Or(c.Linger, DefaultLinger)
	c.MaxConcurrentBatches = cmp.Or(c.MaxConcurrentBatches, DefaultMaxConcurrentBatches)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	return c
}

// Validate reports every problem with c (with its defaults applied), each
// one sentence naming the setting of s to fix.
func (c Common) Validate(s Service) []error {
	c = c.WithDefaults()
	errs := c.Connection.Validate(s)
	if c.BatchSize < 1 || c.BatchSize > 10 {
		errs = append(errs, fmt.Errorf("%s is %d; set it from 1 to 10, the most %s takes", s.key("batch_size"), c.BatchSize, s.BatchCall))
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("%s is %v; set it to 0 or more", s.key("linger"), c.Linger))
	}
	if c.MaxConcurrentBatches < 1 {
		errs = append(errs, fmt.Errorf("%s is %d; set it to 1 or more", s.key("max_concurrent_batches"), c.MaxConcurrentBatches))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("%s is %d; set it to 1 or more", s.key("max_inflight"), c.MaxInFlight))
	}
	if c.MaxMessageBytes < 1024 || c.MaxMessageBytes > s.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("%s is %d; set it from 1024 to %d, the most %s takes", s.key("max_message_bytes"), c.MaxMessageBytes, s.MaxMessageBytes, s.Title))
	}
	return errs
}

// Docs returns the configuration reference's description of every key of
// [Common] in the section of s, with dest, the description of the
// destination key, under destKey.
func Docs(s Service, destKey, dest string) map[string]string {
	batch := "most messages in one `" + s.BatchCall + "`, 1 to 10, one of each aggregate"
	if s.BatchDoc != "" {
		batch += "; " + s.BatchDoc
	}
	docs := ConnectionDocs(s)
	docs[destKey] = dest
	docs["batch_size"] = batch
	docs["linger"] = "the longest a batch of fewer waits for more messages, only while another batch is in flight"
	docs["max_concurrent_batches"] = "batches sent at once"
	docs["max_inflight"] = "messages published and not yet answered; Publish blocks beyond it"
	docs["max_message_bytes"] = "largest message, body and attributes, up to " + s.MaxBytesText + "; a larger one is dead-lettered"
	return docs
}

// Join is errors.Join of first, when not nil, and rest.
func Join(first error, rest []error) error {
	if first != nil {
		rest = append([]error{first}, rest...)
	}
	return errors.Join(rest...)
}
