package webhook

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	// DefaultTimeout bounds one request, from dialing to the end of the
	// answer's headers.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxConnsPerHost is the most requests in flight at once, each
	// on a connection of its own.
	DefaultMaxConnsPerHost = 16
	// DefaultMaxInFlight bounds the messages queued or in flight; Publish
	// blocks beyond it.
	DefaultMaxInFlight = 10_000
	// DefaultMaxRetryAfter caps the pause a Retry-After answer imposes.
	DefaultMaxRetryAfter = time.Minute
	// DefaultBatchLinger is how long a batch may wait for more messages in
	// batch mode. A batch waits only while another request is in flight
	// (or was just answered), whose answer releases the next messages of
	// its aggregates, so it costs an idle relay nothing.
	DefaultBatchLinger = 5 * time.Millisecond
)

// Config configures a webhook [Sink]. The zero value of every field means
// its default; URL and Secret are required.
type Config struct {
	// URL is the template of the endpoint, http:// or https://. The
	// placeholders {aggregate_type}, {event_type} and {table} may stand in
	// the path and the query only (never in the scheme, the user info, the
	// host or the port), and their values are percent-encoded but for
	// letters, digits and "-._~". A password in the URL never appears in
	// logs or errors.
	URL string `yaml:"url" secret:"url"`
	// URLFile names a file holding URL (a mounted secret); the
	// configuration loader reads it, New ignores it.
	URLFile string `yaml:"url_file"`

	// Secret is the signing secret, whsec_ and base64, or several
	// separated by white space while one is rotated: every request is then
	// signed with each, so receivers that know any one of them accept it.
	Secret string `yaml:"secret" secret:"text"`
	// SecretFile names a file holding Secret.
	SecretFile string `yaml:"secret_file"`

	// Username and Password, when Username is set, are sent as basic auth.
	Username     string `yaml:"username"`
	Password     string `yaml:"password" secret:"text"`
	PasswordFile string `yaml:"password_file"`
	// BearerToken, when set, is sent as Authorization: Bearer.
	BearerToken     string `yaml:"bearer_token" secret:"text"`
	BearerTokenFile string `yaml:"bearer_token_file"`

	// Timeout bounds one request until the answer's headers and its first
	// bytes are read, default [DefaultTimeout]. A request that times out is
	// sent again and may then be processed twice.
	Timeout time.Duration `yaml:"timeout"`
	// MaxConnsPerHost is the most requests in flight, and connections
	// open, at once, default [DefaultMaxConnsPerHost].
	MaxConnsPerHost int `yaml:"max_conns_per_host"`
	// MaxInFlight bounds the messages queued or in flight, default
	// [DefaultMaxInFlight]; Publish blocks beyond it.
	MaxInFlight int `yaml:"max_inflight"`
	// MaxPending is the deprecated old name of MaxInFlight
	// (sink.webhook.max_pending): it is read, with a warning, when MaxInFlight is
	// unset, and will be removed.
	MaxPending int `yaml:"max_pending"`
	// MaxRetryAfter caps the pause a Retry-After answer imposes, default
	// [DefaultMaxRetryAfter].
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
	// FollowRedirects follows 3xx answers to URLs of the same scheme, host
	// and port. When false, the default, a 3xx answer is a permanent
	// failure of the message.
	FollowRedirects bool `yaml:"follow_redirects"`

	// Batch is the optional batch mode, off by default.
	Batch Batch `yaml:"batch"`

	// TLSFiles is the file form of TLS, for https:// URLs: a CA to verify
	// the receiver with, a client certificate for mutual TLS.
	TLSFiles sinks.TLS `yaml:"tls"`
	// TLS, when set, is used instead of TLSFiles.
	TLS *tls.Config `yaml:"-"`
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxConnsPerHost = cmp.Or(c.MaxConnsPerHost, DefaultMaxConnsPerHost)
	c.MaxInFlight = cmp.Or(maxPending.Int(c.MaxPending, c.MaxInFlight, DefaultMaxInFlight), DefaultMaxInFlight)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	c.Batch.MaxMessages = cmp.Or(c.Batch.MaxMessages, 1)
	c.Batch.Linger = cmp.Or(c.Batch.Linger, DefaultBatchLinger)
	return c
}

// Validate reports every problem with c, with zero fields standing for
// their defaults. Each problem is one sentence naming the setting to fix.
func (c Config) Validate() error {
	errs := []error{maxPending.CheckInt(c.MaxPending, c.MaxInFlight, DefaultMaxInFlight)}
	c = c.withDefaults()
	// An empty value with its _file set is a file the loader could not
	// read and has reported: one problem, one error.
	if _, err := parseURL(c.URL); err != nil && (c.URL != "" || c.URLFile == "") {
		errs = append(errs, fmt.Errorf("sink.webhook.url: %w", err))
	}
	if _, err := parseSecrets(c.Secret); err != nil && (c.Secret != "" || c.SecretFile == "") {
		errs = append(errs, err)
	}
	if c.Password != "" && c.Username == "" {
		errs = append(errs, errors.New("sink.webhook.password is set without sink.webhook.username; set the username or remove the password"))
	}
	if c.Username != "" && c.BearerToken != "" {
		errs = append(errs, errors.New("sink.webhook.username and sink.webhook.bearer_token are both set; keep one, a request has one Authorization header"))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("sink.webhook.timeout is %v; set it above 0", c.Timeout))
	}
	if c.MaxConnsPerHost < 1 {
		errs = append(errs, fmt.Errorf("sink.webhook.max_conns_per_host is %d; set it to 1 or more", c.MaxConnsPerHost))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("sink.webhook.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	if c.MaxRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("sink.webhook.max_retry_after is %v; set it above 0", c.MaxRetryAfter))
	}
	if c.Batch.MaxMessages < 1 || c.Batch.MaxMessages > MaxBatchMessages {
		errs = append(errs, fmt.Errorf("sink.webhook.batch.max_messages is %d; set it from 1 to %d", c.Batch.MaxMessages, MaxBatchMessages))
	}
	if c.Batch.Linger < 0 {
		errs = append(errs, fmt.Errorf("sink.webhook.batch.linger is %v; set it to 0 or more", c.Batch.Linger))
	}
	if c.TLS == nil && (c.TLSFiles.Enabled || c.TLSFiles.Configured()) {
		if _, err := c.TLSFiles.ClientConfig("sink.webhook.tls"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tlsConfig is the TLS configuration of the client, or nil for the
// default.
func (c Config) tlsConfig() (*tls.Config, error) {
	if c.TLS != nil {
		return c.TLS.Clone(), nil
	}
	if c.TLSFiles.Enabled || c.TLSFiles.Configured() {
		return c.TLSFiles.ClientConfig("sink.webhook.tls")
	}
	return nil, nil
}

// maxPending is max_inflight's old name.
var maxPending = sinks.Renamed{Sink: "webhook", Old: "max_pending", New: "max_inflight"}
