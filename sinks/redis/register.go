package redis

import (
	"context"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var _ sinks.Settings = (*Config)(nil)

// The configuration file's sink.redis section is a Config.
func init() {
	sinks.Register(sinks.Type{
		Name: "redis",
		Defaults: func() sinks.Settings {
			return &Config{
				URL: DefaultURL, Stream: DefaultStream, BatchSize: DefaultBatchSize, MaxInFlight: DefaultMaxInFlight,
				DialTimeout: DefaultDialTimeout, Timeout: DefaultTimeout, WaitTimeout: DefaultWaitTimeout,
			}
		},
		Docs: map[string]string{
			"url":           "Redis URL (`rediss://` for TLS)",
			"url_file":      "file holding `sink.redis.url`",
			"stream":        "stream key template: `{aggregate_type}`, `{event_type}`, `{table}`",
			"max_len":       "trim streams to about this many entries (`MAXLEN ~`), whatever consumer groups have read; 0 never trims",
			"wait_replicas": "after each batch, `WAIT` for this many replicas to acknowledge it, or retry its messages; 0 confirms on the primary's reply",
			"wait_timeout":  "bound of each `WAIT` (below `sink.redis.timeout`)",
			"batch_size":    "XADDs per MULTI/EXEC round trip",
			"max_inflight":  "messages in flight (published, not yet acknowledged) before Publish waits",
			"max_pending":   "deprecated: the old name of `max_inflight`",
			"dial_timeout":  "bound of each connection attempt",
			"timeout":       "bound of writing a batch and reading its replies; a batch that times out is sent again",
		},
	})
}

// Open creates the sink and checks that the server answers.
func (c *Config) Open(ctx context.Context, log *zap.Logger) (relay.Sink, error) {
	s, err := New(*c, log)
	return sinks.Open(ctx, "redis", s, err, sinks.Unreachable("Redis"))
}

// Warnings names the deprecated keys set: no Redis setting works while
// exposing something.
func (c *Config) Warnings() []string {
	if c.MaxPending != 0 {
		return []string{maxPending.Warning()}
	}
	return nil
}

// StaticDestinations: see sinks.StaticDestination.
func (c *Config) StaticDestinations() []string { return sinks.StaticDestination(c.Stream) }
