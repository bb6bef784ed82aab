// Package config is the outboxrelay configuration file: YAML, with every key
// also settable as OUTBOXRELAY_<SECTION>_<KEY> in the environment, defaults,
// and validation that names the key to fix.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Config is the whole configuration file.
type Config struct {
	Postgres Postgres `yaml:"postgres"`
	Sink     Sink     `yaml:"sink"`
	Envelope Envelope `yaml:"envelope"`
	Relay    Relay    `yaml:"relay"`
	HTTP     HTTP     `yaml:"http"`
	Log      Log      `yaml:"log"`
}

// Postgres is the source database.
type Postgres struct {
	// URL of the database; the relay adds replication=database itself.
	URL         string        `yaml:"url"`
	Slot        string        `yaml:"slot"`
	Publication string        `yaml:"publication"`
	Tables      []string      `yaml:"tables"`
	Columns     relay.Columns `yaml:"columns"`
	// MessagePrefix is the prefix of table-less outbox messages.
	MessagePrefix string `yaml:"message_prefix"`
	// StatusInterval is how often the confirmed position is sent to PostgreSQL.
	StatusInterval time.Duration `yaml:"status_interval"`
	// HeartbeatInterval is how often the relay writes a heartbeat message so
	// that an idle outbox does not pin WAL; 0 disables it.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// Retention deletes outbox rows older than this (by columns.created_at),
	// in small batches; 0 keeps every row. Delivery never depends on the
	// rows: the relay publishes from the WAL its slot retains.
	Retention time.Duration `yaml:"retention"`
}

// Envelope chooses the message format.
type Envelope struct {
	// Format is "envelope" (outboxrelay's envelope, version 1) or
	// "cloudevents" (CloudEvents 1.0, structured content mode).
	Format string `yaml:"format"`
	// Source is the CloudEvents source attribute (a URI reference).
	Source string `yaml:"source"`
}

// Sink chooses and configures the broker.
type Sink struct {
	Type     string   `yaml:"type"`
	Kafka    Kafka    `yaml:"kafka"`
	RabbitMQ RabbitMQ `yaml:"rabbitmq"`
	NATS     NATS     `yaml:"nats"`
	Redis    Redis    `yaml:"redis"`
}

// NATS configures sinks/nats (JetStream).
type NATS struct {
	URL     string `yaml:"url"`
	Subject string `yaml:"subject"`
	Stream  string `yaml:"stream"`
	// CreateStream creates Stream, on the template's subject prefix, when it is missing.
	CreateStream    bool          `yaml:"create_stream"`
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	MaxPending      int           `yaml:"max_pending"`
	AckTimeout      time.Duration `yaml:"ack_timeout"`
	CredentialsFile string        `yaml:"credentials_file"`
}

// Redis configures sinks/redis (Redis Streams).
type Redis struct {
	URL    string `yaml:"url"`
	Stream string `yaml:"stream"`
	// MaxLen trims each stream to about this many entries (MAXLEN ~); 0 never trims.
	MaxLen     int64 `yaml:"max_len"`
	BatchSize  int   `yaml:"batch_size"`
	MaxPending int   `yaml:"max_pending"`
}

// Kafka configures sinks/kafka.
type Kafka struct {
	Brokers []string      `yaml:"brokers"`
	Topic   string        `yaml:"topic"`
	Linger  time.Duration `yaml:"linger"`
}

// RabbitMQ configures sinks/rabbitmq.
type RabbitMQ struct {
	URL          string `yaml:"url"`
	Exchange     string `yaml:"exchange"`
	RoutingKey   string `yaml:"routing_key"`
	Declare      bool   `yaml:"declare"`
	ExchangeType string `yaml:"exchange_type"`
	Durable      bool   `yaml:"durable"`
}

// Relay tunes the pipeline.
type Relay struct {
	MaxInFlight      int           `yaml:"max_inflight"`
	MaxInFlightBytes int64         `yaml:"max_inflight_bytes"`
	MaxAttempts      int           `yaml:"max_attempts"`
	DrainTimeout     time.Duration `yaml:"drain_timeout"`
	// DeadLetters stores undeliverable messages in outboxrelay.dead_letters;
	// when false such a message stops the relay instead.
	DeadLetters bool `yaml:"dead_letters"`
}

// HTTP is the health, status and metrics endpoint.
type HTTP struct {
	Listen string `yaml:"listen"`
}

// Log configures logging.
type Log struct {
	Level string `yaml:"level"`
}

// Default returns the configuration used for keys that are not set.
func Default() Config {
	return Config{
		Postgres: Postgres{
			Slot: "outboxrelay", Publication: "outboxrelay", Tables: []string{"public.outbox"},
			Columns: relay.DefaultColumns(), MessagePrefix: "outboxrelay",
			StatusInterval: time.Second, HeartbeatInterval: 10 * time.Second,
		},
		Sink: Sink{
			Type:  "kafka",
			Kafka: Kafka{Topic: "outbox.{aggregate_type}"},
			RabbitMQ: RabbitMQ{
				Exchange: "outbox", RoutingKey: "{aggregate_type}.{event_type}",
				ExchangeType: "topic", Durable: true,
			},
			NATS: NATS{
				URL: "nats://127.0.0.1:4222", Subject: "outbox.{aggregate_type}.{event_type}", Stream: "OUTBOX",
				DuplicateWindow: 2 * time.Minute, MaxPending: 4000, AckTimeout: 10 * time.Second,
			},
			Redis: Redis{URL: "redis://127.0.0.1:6379/0", Stream: "outbox:{aggregate_type}", BatchSize: 256, MaxPending: 10000},
		},
		Envelope: Envelope{Format: "envelope", Source: "outboxrelay"},
		Relay:    Relay{MaxInFlight: 10000, MaxInFlightBytes: 64 << 20, MaxAttempts: 5, DrainTimeout: 30 * time.Second, DeadLetters: true},
		HTTP:     HTTP{Listen: "127.0.0.1:9187"},
		Log:      Log{Level: "info"},
	}
}

// EnvPrefix starts the name of every environment variable the relay reads.
const EnvPrefix = "OUTBOXRELAY_"

// Load reads the YAML file at path (none when path is ""), then applies
// environment overrides from lookup (os.LookupEnv in the binary), then
// validates. Unknown keys are errors.
func Load(path string, lookup func(string) (string, bool)) (Config, error) {
	cfg := Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("read config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // an empty file is fine
			return cfg, fmt.Errorf("config %s: %w", path, err)
		}
	}
	if lookup != nil {
		if err := applyEnv(reflect.ValueOf(&cfg).Elem(), EnvPrefix[:len(EnvPrefix)-1], lookup); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.Validate()
}

// Key is one configuration key.
type Key struct {
	Path    string // postgres.url
	Env     string // OUTBOXRELAY_POSTGRES_URL
	Default string
}

// Keys lists every configuration key with its environment name and default,
// in file order. The README's reference is checked against it.
func Keys() []Key {
	var keys []Key
	var walk func(v reflect.Value, path, env string)
	walk = func(v reflect.Value, path, env string) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			p, e := joinPath(path, name), env+"_"+strings.ToUpper(name)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(v.Field(i), p, e)
				continue
			}
			keys = append(keys, Key{Path: p, Env: e, Default: format(v.Field(i))})
		}
	}
	walk(reflect.ValueOf(Default()), "", EnvPrefix[:len(EnvPrefix)-1])
	return keys
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func format(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case time.Duration:
		return x.String()
	default:
		return fmt.Sprint(x)
	}
}

func applyEnv(v reflect.Value, env string, lookup func(string) (string, bool)) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		e := env + "_" + strings.ToUpper(name)
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
			if err := applyEnv(fv, e, lookup); err != nil {
				return err
			}
			continue
		}
		s, ok := lookup(e)
		if !ok {
			continue
		}
		if err := setValue(fv, s); err != nil {
			return fmt.Errorf("environment %s: %w", e, err)
		}
	}
	return nil
}

func setValue(v reflect.Value, s string) error {
	switch v.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration like 10s", s)
		}
		v.SetInt(int64(d))
		return nil
	case []string:
		var list []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				list = append(list, p)
			}
		}
		v.Set(reflect.ValueOf(list))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q is not true or false", s)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		v.SetInt(n)
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}

// Validate checks every key and reports all problems at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	if c.Postgres.URL == "" {
		errs = append(errs, errors.New("postgres.url is required (or OUTBOXRELAY_POSTGRES_URL)"))
	}
	cc := c.CDC()
	if err := cc.Validate(); err != nil && c.Postgres.URL != "" {
		errs = append(errs, err)
	} else if err != nil {
		// Report the other postgres problems without repeating the URL one.
		for _, e := range splitJoined(err) {
			if !strings.HasPrefix(e.Error(), "postgres.url") {
				errs = append(errs, e)
			}
		}
	}
	for name, v := range map[string]string{"id": c.Postgres.Columns.ID, "aggregate_type": c.Postgres.Columns.AggregateType,
		"aggregate_id": c.Postgres.Columns.AggregateID, "event_type": c.Postgres.Columns.EventType, "payload": c.Postgres.Columns.Payload} {
		if v == "" {
			errs = append(errs, fmt.Errorf("postgres.columns.%s must name a column", name))
		}
	}
	if c.Postgres.StatusInterval < 100*time.Millisecond || c.Postgres.StatusInterval > 10*time.Second {
		errs = append(errs, fmt.Errorf("postgres.status_interval %s must be between 100ms and 10s", c.Postgres.StatusInterval))
	}
	if c.Postgres.HeartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("postgres.heartbeat_interval %s must not be negative", c.Postgres.HeartbeatInterval))
	}
	switch c.Sink.Type {
	case "kafka":
		if len(c.Sink.Kafka.Brokers) == 0 {
			errs = append(errs, errors.New("sink.kafka.brokers needs at least one host:port"))
		}
	case "rabbitmq":
		if c.Sink.RabbitMQ.URL == "" {
			errs = append(errs, errors.New("sink.rabbitmq.url is required"))
		}
	case "nats":
		if c.Sink.NATS.URL == "" {
			errs = append(errs, errors.New("sink.nats.url is required"))
		}
	case "redis":
		if c.Sink.Redis.URL == "" {
			errs = append(errs, errors.New("sink.redis.url is required"))
		}
	default:
		errs = append(errs, fmt.Errorf("sink.type %q is not one of kafka, rabbitmq, nats, redis", c.Sink.Type))
	}
	switch c.Envelope.Format {
	case "envelope":
	case "cloudevents":
		if c.Envelope.Source == "" {
			errs = append(errs, errors.New("envelope.source must be a URI reference for CloudEvents"))
		}
	default:
		errs = append(errs, fmt.Errorf("envelope.format %q is not one of envelope, cloudevents", c.Envelope.Format))
	}
	if c.Postgres.Retention < 0 {
		errs = append(errs, fmt.Errorf("postgres.retention %s must not be negative", c.Postgres.Retention))
	}
	if c.Relay.MaxInFlight < 1 {
		errs = append(errs, errors.New("relay.max_inflight must be at least 1"))
	}
	if c.Relay.MaxInFlightBytes < 1<<10 {
		errs = append(errs, errors.New("relay.max_inflight_bytes must be at least 1024"))
	}
	if c.Relay.MaxAttempts < 1 {
		errs = append(errs, errors.New("relay.max_attempts must be at least 1"))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log.level %q is not one of debug, info, warn, error", c.Log.Level))
	}
	return errors.Join(errs...)
}

func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// CDC returns the replication settings.
func (c *Config) CDC() cdc.Config {
	return cdc.Config{
		URL: c.Postgres.URL, Slot: c.Postgres.Slot, Publication: c.Postgres.Publication, Tables: c.Postgres.Tables,
		StatusInterval: c.Postgres.StatusInterval, DrainTimeout: c.Relay.DrainTimeout,
	}
}
