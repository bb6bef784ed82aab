package rabbitmq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied by New to the zero values of Config.
const (
	DefaultExchange            = "outbox"
	DefaultRoutingKey          = "{aggregate_type}.{event_type}"
	DefaultExchangeType        = "topic"
	DefaultMaxInFlight         = 1000
	DefaultDialTimeout         = 10 * time.Second
	DefaultReconnectBackoffMin = 100 * time.Millisecond
	DefaultReconnectBackoffMax = 30 * time.Second
	// DefaultMaxMessageBytes is RabbitMQ's default max_message_size (128 MiB).
	DefaultMaxMessageBytes = 128 << 20
)

// Config configures a Sink. The zero value of every field but URL means
// "use the default"; New applies the defaults.
type Config struct {
	// URL is the AMQP URI, amqp:// or amqps://. Its password never appears
	// in logs or errors.
	URL string `yaml:"url" secret:"url"`
	// URLFile names a file holding URL (a mounted secret); the
	// configuration loader reads it, New ignores it.
	URLFile string `yaml:"url_file"`
	// Exchange every message is published to. Default "outbox".
	Exchange string `yaml:"exchange"`
	// RoutingKey is a template with the placeholders {aggregate_type},
	// {event_type} and {table}. Default "{aggregate_type}.{event_type}".
	// Inside substituted values the characters '.', '*', '#' and '%' are
	// percent-encoded (%2E, %2A, %23, %25), so a value is always exactly one
	// topic word and can never add words or wildcards: event_type
	// "order.created" renders the default template as
	// "order.order%2Ecreated". Literal text of the template is used as is.
	RoutingKey string `yaml:"routing_key"`
	// Declare makes the sink declare the exchange on every connect. When
	// false the exchange must exist; connecting checks it passively.
	Declare bool `yaml:"declare"`
	// ExchangeType used when Declare is set: direct, fanout, topic, headers
	// or a plugin type starting with "x-". Default "topic".
	ExchangeType string `yaml:"exchange_type"`
	// Durable is the durability of the declared exchange; nil means true.
	// (A pointer, because the default is true and a plain bool cannot tell
	// "unset" from false.)
	Durable *bool `yaml:"durable"`
	// TLSFiles is the file form of TLS, for amqps:// URLs: when TLS is nil
	// and any of its settings is set, New builds TLS from its files.
	TLSFiles sinks.TLS `yaml:"tls"`
	// Auth is "plain" (the URL's user and password, the default) or
	// "external" (the client certificate, SASL EXTERNAL; needs amqps://,
	// tls.cert_file and key_file, and the broker's
	// rabbitmq_auth_mechanism_ssl plugin). SASL, when set, wins.
	Auth string `yaml:"auth"`
	// MaxInFlight bounds the messages published but not yet confirmed by the
	// broker; Publish blocks when it is reached. Default 1000.
	MaxInFlight int `yaml:"-"`
	// MaxMessageBytes is the largest body the sink publishes; larger messages
	// fail with a permanent error instead of making the broker close the
	// channel. Set it to the broker's max_message_size. Default 128 MiB.
	MaxMessageBytes int `yaml:"-"`
	// DialTimeout bounds the TCP connect, TLS and AMQP handshakes of one
	// connection attempt. Default 10s.
	DialTimeout time.Duration `yaml:"-"`
	// ReconnectBackoffMin and ReconnectBackoffMax bound the exponential
	// backoff, with jitter, between connection attempts. Defaults 100ms, 30s.
	ReconnectBackoffMin time.Duration `yaml:"-"`
	ReconnectBackoffMax time.Duration `yaml:"-"`
	// TLS configures amqps:// connections; nil uses the system roots and the
	// URL's host as server name. An empty ServerName means the URL's host.
	// Set Certificates to present a client certificate. The sink never
	// modifies it.
	TLS *tls.Config `yaml:"-"`
	// SASL are the authentication mechanisms to offer, in order of
	// preference. Nil means PLAIN with the URL's user and password (or the
	// URL's auth_mechanism). [ExternalAuth] authenticates with the client
	// certificate of TLS instead of a password.
	SASL []amqp.Authentication `yaml:"-"`
}

// ExternalAuth returns the SASL EXTERNAL mechanism: the broker takes the
// user from the client certificate that TLS presents (RabbitMQ's
// rabbitmq_auth_mechanism_ssl plugin). No password is sent.
func ExternalAuth() []amqp.Authentication {
	return []amqp.Authentication{&amqp.ExternalAuth{}}
}

// Validate reports the problems with c, each one sentence that names the
// fix: first those of the file settings (url, tls, auth), then, when they
// are fine, the first problem with the connection settings they make. Zero
// values are valid: they stand for the defaults.
func (c *Config) Validate() error {
	var errs []error
	amqps := strings.HasPrefix(strings.ToLower(c.URL), "amqps://")
	if c.URL == "" {
		errs = append(errs, errors.New("sink.rabbitmq.url is empty; set it (or sink.rabbitmq.url_file), e.g. amqp://user:password@host:5672/"))
	}
	if (c.TLSFiles.Enabled || c.TLSFiles.Configured()) && !amqps && c.URL != "" {
		errs = append(errs, errors.New("sink.rabbitmq.tls is set but sink.rabbitmq.url is not amqps://; use an amqps:// URL"))
	}
	if c.TLSFiles.Configured() {
		if _, err := c.TLSFiles.ClientConfig("sink.rabbitmq.tls"); err != nil {
			errs = append(errs, err)
		}
	}
	switch c.Auth {
	case "", AuthPlain:
	case AuthExternal:
		if !amqps || c.TLSFiles.CertFile == "" && c.TLS == nil {
			errs = append(errs, errors.New("sink.rabbitmq.auth external authenticates with the client certificate; use an amqps:// url and set sink.rabbitmq.tls.cert_file and key_file"))
		}
	default:
		errs = append(errs, fmt.Errorf("sink.rabbitmq.auth %q is not one of plain, external", c.Auth))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	r, err := c.resolve()
	if err != nil {
		return err
	}
	return r.validate()
}

// Values of Config.Auth.
const (
	AuthPlain    = "plain"
	AuthExternal = "external"
)

// resolve returns c with TLS and SASL made from their file forms, TLSFiles
// and Auth, where they are not set.
func (c Config) resolve() (Config, error) {
	if c.TLS == nil && c.TLSFiles.Configured() {
		t, err := c.TLSFiles.ClientConfig("sink.rabbitmq.tls")
		if err != nil {
			return c, err
		}
		c.TLS = t
	}
	if c.SASL == nil && c.Auth == AuthExternal {
		c.SASL = ExternalAuth()
	}
	return c, nil
}

// validate reports the first problem with the connection settings of c.
func (c *Config) validate() error {
	if c.URL == "" {
		return errors.New("rabbitmq url is empty; set sink.rabbitmq.url, e.g. amqp://user:password@host:5672/")
	}
	uri, err := amqp.ParseURI(c.URL)
	if err != nil {
		return fmt.Errorf("rabbitmq url %s is invalid: %w", redact.URL(c.URL), redact.Error(err, c.URL))
	}
	if c.TLS != nil && uri.Scheme != "amqps" {
		return fmt.Errorf("rabbitmq tls is configured but url %s is not amqps://; use an amqps:// url", redact.URL(c.URL))
	}
	for _, a := range c.SASL {
		if a != nil && a.Mechanism() == "EXTERNAL" && (uri.Scheme != "amqps" || c.TLS == nil || len(c.TLS.Certificates) == 0 && c.TLS.GetClientCertificate == nil) {
			return errors.New("rabbitmq EXTERNAL authentication needs an amqps:// url and a client certificate in TLS")
		}
	}
	if len(c.Exchange) > 255 {
		return fmt.Errorf("rabbitmq exchange name is %d bytes; use at most 255", len(c.Exchange))
	}
	if c.RoutingKey != "" {
		if _, err := parseTemplate(c.RoutingKey); err != nil {
			return fmt.Errorf("rabbitmq routing_key: %w", err)
		}
	}
	switch t := c.ExchangeType; {
	case t == "", t == amqp.ExchangeDirect, t == amqp.ExchangeFanout,
		t == amqp.ExchangeTopic, t == amqp.ExchangeHeaders, strings.HasPrefix(t, "x-"):
	default:
		return fmt.Errorf("rabbitmq exchange type %q is unknown; use direct, fanout, topic, headers or a plugin type whose name starts with x-", t)
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("rabbitmq max_in_flight is %d; use a positive number or 0 for the default %d", c.MaxInFlight, DefaultMaxInFlight)
	}
	if c.MaxMessageBytes < 0 {
		return fmt.Errorf("rabbitmq max_message_bytes is %d; use a positive number or 0 for the default %d", c.MaxMessageBytes, DefaultMaxMessageBytes)
	}
	if c.DialTimeout < 0 || c.ReconnectBackoffMin < 0 || c.ReconnectBackoffMax < 0 {
		return errors.New("rabbitmq dial_timeout and reconnect backoff must not be negative; use 0 for the defaults")
	}
	lo, hi := c.ReconnectBackoffMin, c.ReconnectBackoffMax
	if lo == 0 {
		lo = DefaultReconnectBackoffMin
	}
	if hi == 0 {
		hi = DefaultReconnectBackoffMax
	}
	if lo > hi {
		return fmt.Errorf("rabbitmq reconnect backoff min %s is above max %s; lower the min or raise the max", lo, hi)
	}
	return nil
}

// withDefaults returns c with the defaults filled in.
func (c Config) withDefaults() Config {
	c.Exchange = cmp.Or(c.Exchange, DefaultExchange)
	c.RoutingKey = cmp.Or(c.RoutingKey, DefaultRoutingKey)
	c.ExchangeType = cmp.Or(c.ExchangeType, DefaultExchangeType)
	if c.Durable == nil {
		t := true
		c.Durable = &t
	}
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.ReconnectBackoffMin = cmp.Or(c.ReconnectBackoffMin, DefaultReconnectBackoffMin)
	c.ReconnectBackoffMax = cmp.Or(c.ReconnectBackoffMax, DefaultReconnectBackoffMax)
	return c
}
