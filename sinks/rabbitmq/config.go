package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
	// DefaultMaxMessageSize is RabbitMQ's default max_message_size (128 MiB).
	DefaultMaxMessageSize = 128 << 20
)

// Config configures a Sink. The zero value of every field but URL means
// "use the default"; New applies the defaults.
type Config struct {
	// URL is the AMQP URI, amqp:// or amqps://. Its password never appears
	// in logs or errors.
	URL string
	// Exchange every message is published to. Default "outbox".
	Exchange string
	// RoutingKey is a template with the placeholders {aggregate_type},
	// {event_type} and {table}. Default "{aggregate_type}.{event_type}".
	// Inside substituted values the characters '.', '*', '#' and '%' are
	// percent-encoded (%2E, %2A, %23, %25), so a value is always exactly one
	// topic word and can never add words or wildcards: event_type
	// "order.created" renders the default template as
	// "order.order%2Ecreated". Literal text of the template is used as is.
	RoutingKey string
	// Declare makes the sink declare the exchange on every connect. When
	// false the exchange must exist; connecting checks it passively.
	Declare bool
	// ExchangeType used when Declare is set: direct, fanout, topic, headers
	// or a plugin type starting with "x-". Default "topic".
	ExchangeType string
	// Durable is the durability of the declared exchange; nil means true.
	// (A pointer, because the default is true and a plain bool cannot tell
	// "unset" from false.)
	Durable *bool
	// MaxInFlight bounds the messages published but not yet confirmed by the
	// broker; Publish blocks when it is reached. Default 1000.
	MaxInFlight int
	// MaxMessageSize is the largest body the sink publishes; larger messages
	// fail with a permanent error instead of making the broker close the
	// channel. Set it to the broker's max_message_size. Default 128 MiB.
	MaxMessageSize int
	// DialTimeout bounds the TCP connect, TLS and AMQP handshakes of one
	// connection attempt. Default 10s.
	DialTimeout time.Duration
	// ReconnectBackoffMin and ReconnectBackoffMax bound the exponential
	// backoff, with jitter, between connection attempts. Defaults 100ms, 30s.
	ReconnectBackoffMin, ReconnectBackoffMax time.Duration
	// TLS configures amqps:// connections; nil uses the system roots and the
	// URL's host as server name. An empty ServerName means the URL's host.
	// Set Certificates to present a client certificate. The sink never
	// modifies it.
	TLS *tls.Config
	// SASL are the authentication mechanisms to offer, in order of
	// preference. Nil means PLAIN with the URL's user and password (or the
	// URL's auth_mechanism). [ExternalAuth] authenticates with the client
	// certificate of TLS instead of a password.
	SASL []amqp.Authentication
}

// ExternalAuth returns the SASL EXTERNAL mechanism: the broker takes the
// user from the client certificate that TLS presents (RabbitMQ's
// rabbitmq_auth_mechanism_ssl plugin). No password is sent.
func ExternalAuth() []amqp.Authentication {
	return []amqp.Authentication{&amqp.ExternalAuth{}}
}

// Validate reports the first problem with c as one sentence that names the
// fix. Zero values are valid: they stand for the defaults.
func (c *Config) Validate() error {
	if c.URL == "" {
		return errors.New("rabbitmq url is empty; set sink.rabbitmq.url, e.g. amqp://user:password@host:5672/")
	}
	uri, err := amqp.ParseURI(c.URL)
	if err != nil {
		return fmt.Errorf("rabbitmq url %s is invalid: %w", redactURL(c.URL), redactError(err, c.URL))
	}
	if c.TLS != nil && uri.Scheme != "amqps" {
		return fmt.Errorf("rabbitmq tls is configured but url %s is not amqps://; use an amqps:// url", redactURL(c.URL))
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
		return fmt.Errorf("rabbitmq exchange type %q is unknown; use direct, fanout, topic, headers or a plugin type x-...", t)
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("rabbitmq max_in_flight is %d; use a positive number or 0 for the default %d", c.MaxInFlight, DefaultMaxInFlight)
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("rabbitmq max_message_size is %d; use a positive number or 0 for the default %d", c.MaxMessageSize, DefaultMaxMessageSize)
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
	if c.Exchange == "" {
		c.Exchange = DefaultExchange
	}
	if c.RoutingKey == "" {
		c.RoutingKey = DefaultRoutingKey
	}
	if c.ExchangeType == "" {
		c.ExchangeType = DefaultExchangeType
	}
	if c.Durable == nil {
		t := true
		c.Durable = &t
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.ReconnectBackoffMin == 0 {
		c.ReconnectBackoffMin = DefaultReconnectBackoffMin
	}
	if c.ReconnectBackoffMax == 0 {
		c.ReconnectBackoffMax = DefaultReconnectBackoffMax
	}
	return c
}
