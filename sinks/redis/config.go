package redis

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Defaults applied by [New] to zero fields of a [Config].
const (
	DefaultURL    = "redis://127.0.0.1:6379/0"
	DefaultStream = "outbox:{aggregate_type}"
	// DefaultBatchSize is the most XADDs in one MULTI/EXEC round trip.
	// Around 256 1 KB entries a batch the round trip stops being the cost;
	// larger batches only hold the server longer.
	DefaultBatchSize = 256
	// DefaultMaxInFlight bounds the messages queued or in a batch; Publish
	// blocks beyond it.
	DefaultMaxInFlight = 10_000
	DefaultDialTimeout = 5 * time.Second
	// DefaultTimeout bounds reading and writing one batch.
	DefaultTimeout = 10 * time.Second
	// DefaultWaitTimeout bounds a WAIT for replicas (wait_replicas).
	DefaultWaitTimeout = time.Second
)

// Config configures a Redis Streams [Sink]. The zero value of every field
// means its default.
type Config struct {
	// URL of the Redis server, default [DefaultURL]:
	// redis://[user:password@]host:port/db, rediss:// for TLS, or
	// unix:///path/to/socket?db=0. Its password never appears in logs or
	// errors.
	URL string `yaml:"url" secret:"url"`

	// URLFile names a file holding URL (a mounted secret); the
	// configuration loader reads it, New ignores it.
	URLFile string `yaml:"url_file"`

	// Stream is the template of the stream key, default [DefaultStream].
	// The placeholders {aggregate_type}, {event_type} and {table} are
	// replaced by the message's fields as they are (keys are binary-safe);
	// any other placeholder is a configuration error.
	Stream string `yaml:"stream"`

	// MaxLen trims every stream the sink appends to to about this many
	// entries (XADD MAXLEN ~ MaxLen: Redis trims whole macro nodes, so a
	// stream can hold somewhat more). 0, the default, never trims. Redis
	// trims the oldest entries whatever its consumer groups have read: an
	// entry a slow group has not read yet is gone all the same.
	MaxLen int64 `yaml:"max_len"`

	// WaitReplicas, when above 0, makes the sink send WAIT WaitReplicas
	// WaitTimeout after each batch, on the connection that appended it,
	// and confirm the batch only when that many replicas acknowledged it;
	// otherwise its messages fail with ErrTooFewReplicas (retryable) and
	// the relay sends them again. 0, the default, confirms on the
	// primary's reply, which Redis gives before an fsync unless
	// appendfsync is always.
	WaitReplicas int `yaml:"wait_replicas"`

	// WaitTimeout bounds each WAIT, default [DefaultWaitTimeout]; it must
	// be below Timeout.
	WaitTimeout time.Duration `yaml:"wait_timeout"`

	// BatchSize is the most messages sent in one MULTI/EXEC pipeline,
	// default [DefaultBatchSize].
	BatchSize int `yaml:"batch_size"`

	// MaxInFlight bounds the messages published but not yet confirmed,
	// default [DefaultMaxInFlight]; Publish blocks beyond it.
	MaxInFlight int `yaml:"max_inflight"`
	// MaxPending is the deprecated old name of MaxInFlight
	// (sink.redis.max_pending): it is read, with a warning, when MaxInFlight is
	// unset, and will be removed.
	MaxPending int `yaml:"max_pending"`

	// DialTimeout bounds each connection attempt, default
	// [DefaultDialTimeout].
	DialTimeout time.Duration `yaml:"dial_timeout"`

	// Timeout bounds writing a batch and reading its replies, and a
	// health ping, default [DefaultTimeout]. A batch that times out is
	// sent again and may then be stored twice; raise it for large batches
	// over a slow link rather than let them time out.
	Timeout time.Duration `yaml:"timeout"`

	// TLS, when set, is used for the connection (rediss:// URLs get a
	// default TLS configuration without it).
	TLS *tls.Config `yaml:"-"`
}

func (c Config) withDefaults() Config {
	c.URL = cmp.Or(c.URL, DefaultURL)
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.MaxInFlight = cmp.Or(maxPending.Int(c.MaxPending, c.MaxInFlight, DefaultMaxInFlight), DefaultMaxInFlight)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.WaitTimeout = cmp.Or(c.WaitTimeout, DefaultWaitTimeout)
	return c
}

// Validate reports every problem with c, with zero fields standing for their
// defaults. Each problem is one sentence naming the setting to fix.
func (c Config) Validate() error {
	errs := []error{maxPending.CheckInt(c.MaxPending, c.MaxInFlight, DefaultMaxInFlight)}
	c = c.withDefaults()
	if _, err := goredis.ParseURL(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("sink.redis.url %s is invalid (%v); use redis://host:6379/0", redact.URL(c.URL), redact.Error(err, c.URL)))
	}
	if _, err := parseTemplate(c.Stream); err != nil {
		errs = append(errs, fmt.Errorf("sink.redis.stream: %w", err))
	}
	if c.MaxLen < 0 {
		errs = append(errs, fmt.Errorf("sink.redis.max_len is %d; set it to 0 (no trimming) or more", c.MaxLen))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("sink.redis.batch_size is %d; set it to 1 or more", c.BatchSize))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("sink.redis.max_inflight is %d; set it to 1 or more", c.MaxInFlight))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("sink.redis.dial_timeout is %v; set it above 0", c.DialTimeout))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("sink.redis.timeout is %v; set it above 0", c.Timeout))
	}
	if c.WaitReplicas < 0 {
		errs = append(errs, fmt.Errorf("sink.redis.wait_replicas is %d; set it to 0 (no WAIT) or the number of replicas that must have each batch", c.WaitReplicas))
	}
	if c.WaitReplicas > 0 && (c.WaitTimeout < 0 || c.WaitTimeout >= c.Timeout) {
		errs = append(errs, fmt.Errorf("sink.redis.wait_timeout is %v; set it above 0 and below sink.redis.timeout (%v)", c.WaitTimeout, c.Timeout))
	}
	return errors.Join(errs...)
}

// maxPending is max_inflight's old name.
var maxPending = sinks.Renamed{Sink: "redis", Old: "max_pending", New: "max_inflight"}
