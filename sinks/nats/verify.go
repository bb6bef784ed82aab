package nats

import (
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the sink's JetStream stream.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	return verify.NATS{URL: c.URL, CredentialsFile: c.CredentialsFile, Stream: c.Stream}, nil, nil
}
