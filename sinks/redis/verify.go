package redis

import (
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/verify"
)

var _ sinks.Verifiable = (*Config)(nil)

// VerifyReader reads the streams the rows map to.
func (c *Config) VerifyReader(sinks.VerifyOptions) (verify.Reader, func(*relay.Message) (string, error), error) {
	opt, err := goredis.ParseURL(c.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.redis.url: %w", err)
	}
	dest, err := sinks.Destinations(c.Stream)
	if err != nil {
		return nil, nil, fmt.Errorf("sink.redis.stream: %w", err)
	}
	return verify.Redis{Client: goredis.NewClient(opt)}, dest, nil
}
