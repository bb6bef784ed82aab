package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var _ sinks.Settings = (*Config)(nil)

// The configuration file's sink.rabbitmq section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "rabbitmq",
		Defaults: func() sinks.Settings {
			durable := true
			return &Config{
				Exchange: DefaultExchange, RoutingKey: DefaultRoutingKey,
				ExchangeType: DefaultExchangeType, Durable: &durable, Auth: AuthPlain,
			}
		},
		Docs: map[string]string{
			"url":                      "`amqp://` or `amqps://` URL with credentials",
			"url_file":                 "file holding `sink.rabbitmq.url`",
			"exchange":                 "exchange to publish to",
			"routing_key":              "routing key template: `{aggregate_type}`, `{event_type}`, `{table}`",
			"declare":                  "declare the exchange on connect",
			"exchange_type":            "exchange type when declaring",
			"durable":                  "durable exchange when declaring",
			"tls.enabled":              "use TLS (implied by `amqps://`)",
			"tls.ca_file":              "CA bundle for the broker's certificate",
			"tls.cert_file":            "client certificate",
			"tls.key_file":             "client key",
			"tls.server_name":          "name to verify in the broker's certificate",
			"tls.insecure_skip_verify": "skip certificate verification (tests only)",
			"auth":                     "`plain` (user and password from the URL) or `external` (client certificate)",
		},
	})
}

// Open creates the sink and connects it, checking the exchange; errors name
// the settings to check (TLS, EXTERNAL authentication).
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "rabbitmq", s, err, func(err error) error {
		if ce := sinks.CertError(err); ce != nil {
			return fmt.Errorf("cannot reach RabbitMQ: the broker's TLS certificate did not verify (%v); check sink.rabbitmq.tls.ca_file and server_name", ce)
		}
		if c.Auth == AuthExternal && errors.Is(err, amqp.ErrSASL) {
			return fmt.Errorf("cannot reach RabbitMQ: %w; auth: external needs the broker's rabbitmq_auth_mechanism_ssl plugin and EXTERNAL in its auth_mechanisms", err)
		}
		return fmt.Errorf("cannot reach RabbitMQ: %w", err)
	})
}

// Warnings names settings that accept any broker.
func (c *Config) Warnings() []string {
	if c.TLSFiles.InsecureSkipVerify {
		return []string{"sink.rabbitmq.tls.insecure_skip_verify accepts any broker certificate; use sink.rabbitmq.tls.ca_file instead"}
	}
	return nil
}

// StaticDestinations is the destination of every message (exchange/key)
// when the routing key template has no placeholder, so that
// per-destination metrics exist from the start; else nothing.
func (c *Config) StaticDestinations() []string {
	if strings.Contains(c.RoutingKey, "{") {
		return nil
	}
	return []string{c.Exchange + "/" + c.RoutingKey}
}
