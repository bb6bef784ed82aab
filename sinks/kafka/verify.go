package kafka

import (
	"fmt"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the topics the rows map to, with the sink's own
// client settings (TLS, SASL).
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	opts, err := c.ClientOpts()
	if err != nil {
		return nil, nil, err
	}
	dest, err := sinks.Destinations(c.Topic)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.kafka.topic: %w", err)
	}
	return verify.Kafka{Opts: opts}, dest, nil
}
