package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/rules"
)

// Columns names the outbox table's columns. Empty optional names mean the
// table has no such column.
type Columns struct {
	ID            string `yaml:"id"`
	AggregateType string `yaml:"aggregate_type"`
	AggregateID   string `yaml:"aggregate_id"`
	EventType     string `yaml:"event_type"`
	Payload       string `yaml:"payload"`
	Headers       string `yaml:"headers"`
	Traceparent   string `yaml:"traceparent"`
	SchemaVersion string `yaml:"schema_version"`
	CreatedAt     string `yaml:"created_at"`
	// Key is the column whose value is the Kafka record key; empty means
	// the aggregate id. Per-aggregate order holds per aggregate whatever
	// the key: a key other than the aggregate id may spread an
	// aggregate's records over partitions.
	Key string `yaml:"key"`
	// Timestamp is a timestamptz column that becomes the record timestamp
	// (Kafka's timestamp, AMQP's timestamp property) and the envelope's
	// occurred_at (CloudEvents time); empty: occurred_at from CreatedAt,
	// and the brokers' own timestamps.
	Timestamp string `yaml:"timestamp"`
}

// DefaultColumns are the column names of the table `outboxrelay migrate` creates.
func DefaultColumns() Columns {
	return Columns{
		ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
		Payload: "payload", Headers: "headers", Traceparent: "traceparent",
		SchemaVersion: "schema_version", CreatedAt: "created_at",
	}
}

// Required lists the columns every outbox table must have.
func (c Columns) Required() []string {
	return []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}
}

// Missing reports each routing field em lacks (message id, aggregate
// type, aggregate id, event type), named by its column: a message without
// one is invalid. It is the one check of them: the Builder dead-letters a
// row that fails it, and a dead letter's replay refuses a letter that
// fails it (store.DeadLetters.Replay), so no path publishes such a message
// unless an operator forces it.
func (c Columns) Missing(em *envelope.Message) error {
	var errs []error
	for _, f := range [...]struct{ column, value string }{{c.ID, em.MessageID}, {c.AggregateType, em.AggregateType},
		{c.AggregateID, em.AggregateID}, {c.EventType, em.EventType}} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("column %s is null or empty", f.column))
		}
	}
	return errors.Join(errs...)
}

// Config configures the pipeline. It is plain data: what the relay calls
// out to is in Options. The zero value of every field means its default
// (WithDefaults); New applies them.
//
// Its yaml keys are the configuration file's relay section, which embeds
// it; Docs describes them. Outbox and Envelope are sections of their own in
// the file (postgres and envelope), as are the fields tagged yaml:"-" that
// the program sets: adding a key to the relay section is adding a field
// here, with its default, its check in Validate and its line in Docs.
type Config struct {
	// MaxInFlight and MaxInFlightBytes bound the messages handed to the sink
	// and not yet acknowledged (defaults 10000 and 64 MiB).
	MaxInFlight      int   `yaml:"max_inflight"`
	MaxInFlightBytes int64 `yaml:"max_inflight_bytes"`
	// MaxAttempts is how often the broker may refuse a message for good
	// (Permanent) before it is dead-lettered (default 5). Retryable
	// failures are retried without limit and do not count
	// (Message.Refusals).
	MaxAttempts int `yaml:"max_attempts"`
	// DeadLetterOrder is DeadLetterPark (default) or DeadLetterPass. It
	// applies to messages the broker refused, when Options.Parking is set.
	DeadLetterOrder DeadLetterOrder `yaml:"dead_letter_order"`
	// Order is OrderAggregate (default: one message per aggregate at the
	// sink at a time) or OrderNone (no gate: an aggregate's messages are
	// in flight together, up to the window, and a retry or a dead letter
	// can reorder them). OrderNone cannot park, so it requires
	// DeadLetterOrder to be DeadLetterPass.
	Order Order `yaml:"order"`
	// Behind is what a sink that falls behind the others does, when the
	// relay feeds several (NewSinks): BehindSpill (default) or BehindHold.
	// With one sink it is not used: that sink holds the slot.
	Behind Behind `yaml:"behind"`
	// RetryMin and RetryMax bound the exponential retry backoff (defaults 100ms, 30s).
	RetryMin time.Duration `yaml:"-"`
	RetryMax time.Duration `yaml:"-"`
	// CheckpointInterval is how often a new position is recorded (default
	// 100ms): a position that passed changes for the relay is recorded at the next
	// tick, so a busy relay writes ten small upserts a second, and a crash
	// repeats about a tenth of a second of acknowledged messages rather
	// than a second of them.
	CheckpointInterval time.Duration `yaml:"-"`
	// IdleCheckpointInterval is how often a position that passed no change
	// for the relay is recorded (default 10s): one moved only by keepalives
	// and by transactions that brought nothing, the relay's own checkpoint
	// writes and heartbeats among them. Recording it lets the slot free the
	// WAL before it; recording it at once would make every record the cause
	// of the next (the record's WAL moves the position), so an idle relay
	// writes once per interval. internal/config sets it to
	// postgres.heartbeat_interval.
	IdleCheckpointInterval time.Duration `yaml:"-"`

	// Outbox is how rows become messages (the file's postgres section).
	Outbox `yaml:"-"`
	// Envelope is the body format (the file's envelope section).
	Envelope `yaml:"-"`

	// Rules are the routing rules (the file's routes, unmatched and
	// transform keys); no routes: every row goes to the sink's destination.
	Rules rules.Config `yaml:"-"`

	// Database is written to the envelope's source.database.
	Database string `yaml:"-"`
	// Tables are the outbox tables as schema.name. Empty: every published
	// table. Used only when Options.Resolver is nil.
	Tables []string `yaml:"-"`
	// MessagingSystem is the spans' messaging.system attribute: the sink's
	// name (kafka, rabbitmq, nats, redis).
	MessagingSystem string `yaml:"-"`
}

// Outbox says how the outbox table's rows become messages. The
// configuration file's postgres section embeds it.
type Outbox struct {
	// Columns names the table's columns (default DefaultColumns).
	Columns Columns `yaml:"columns"`
	// MessagePrefix is the prefix of table-less outbox messages
	// (pg_logical_emit_message); default "outboxrelay".
	MessagePrefix string `yaml:"message_prefix"`
	// HeaderColumns are further columns of the table sent as broker
	// headers named for the column, after the row's headers; a NULL value
	// sends no header.
	HeaderColumns []string `yaml:"header_columns"`
	// EnvelopeColumns are further columns of the table placed into the
	// envelope, named for the column (envelope.Message.Fields): top-level
	// fields of the version 1 envelope, CloudEvents extension attributes,
	// fields next to "payload" in the debezium format.
	EnvelopeColumns []string `yaml:"envelope_columns"`
}

// Envelope chooses the body format; it is the configuration file's
// envelope section.
type Envelope struct {
	// Format is FormatEnvelope (default), FormatCloudEvents (structured
	// content mode), FormatCloudEventsBinary or FormatDebezium.
	Format Format `yaml:"format"`
	// CloudEventsSource is the CloudEvents source attribute (a URI
	// reference), default "outboxrelay".
	CloudEventsSource string `yaml:"source"`
}

// Order is the delivery order the relay keeps.
type Order string

// The delivery orders.
const (
	// OrderAggregate hands an aggregate's next message to the sink only
	// once the previous one is settled.
	OrderAggregate Order = "aggregate"
	// OrderNone hands every message over at once: an aggregate's first
	// deliveries keep the commit order only while nothing fails.
	OrderNone Order = "none"
)

// Behind is what a sink that falls behind the others does (Config.Behind).
type Behind string

// The policies for a sink that falls behind.
const (
	// BehindSpill stores the sink's further messages in the Spill store
	// once it holds its share of the in-flight bound, and delivers them
	// from there, in commit order, as it catches up. The slot and the
	// other sinks go on: a stored message counts as settled for the slot.
	BehindSpill Behind = "spill"
	// BehindHold keeps the sink's messages in memory: once the in-flight
	// bound is full, the stream waits, and every sink with it.
	BehindHold Behind = "hold"
)

// Format is the body format of published messages.
type Format string

// The body formats.
const (
	FormatEnvelope          Format = "envelope"
	FormatCloudEvents       Format = "cloudevents"
	FormatCloudEventsBinary Format = "cloudevents-binary"
	// FormatDebezium is the output of Debezium's outbox event router with
	// its defaults and expand-JSON: the payload as the body and an id
	// header (envelope.Debezium), for consumers written for Debezium.
	FormatDebezium Format = "debezium"
)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Outbox = c.Outbox.WithDefaults()
	c.Envelope = c.Envelope.WithDefaults()
	c.MaxInFlight = cmp.Or(c.MaxInFlight, 10000)
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, 64<<20)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 5)
	c.DeadLetterOrder = cmp.Or(c.DeadLetterOrder, DeadLetterPark)
	c.Order = cmp.Or(c.Order, OrderAggregate)
	c.Behind = cmp.Or(c.Behind, BehindSpill)
	c.RetryMin = cmp.Or(c.RetryMin, 100*time.Millisecond)
	c.RetryMax = cmp.Or(c.RetryMax, 30*time.Second)
	c.CheckpointInterval = cmp.Or(c.CheckpointInterval, 100*time.Millisecond)
	c.IdleCheckpointInterval = cmp.Or(c.IdleCheckpointInterval, 10*time.Second)
	return c
}

// Validate reports every problem with c, which must have its defaults
// (WithDefaults; the configuration file starts from them, so a key set to
// 0 there is a problem): its Outbox's, its Envelope's and its own. Each is
// one sentence naming the key to fix.
func (c Config) Validate() error {
	errs := []error{c.Outbox.Validate(), c.Envelope.Validate()}
	if c.cloudEvents() {
		if err := c.Outbox.envelopeColumnsError(true); err != nil && c.Outbox.envelopeColumnsError(false) == nil {
			errs = append(errs, err)
		}
	}
	if _, err := c.compileRules(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, errors.New("relay.max_inflight must be at least 1"))
	}
	if c.MaxInFlightBytes < 1<<10 {
		errs = append(errs, errors.New("relay.max_inflight_bytes must be at least 1024"))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, errors.New("relay.max_attempts must be at least 1"))
	}
	switch c.DeadLetterOrder {
	case DeadLetterPark, DeadLetterPass:
	default:
		errs = append(errs, fmt.Errorf("relay.dead_letter_order %q is not one of park, pass", c.DeadLetterOrder))
	}
	switch c.Order {
	case OrderAggregate:
	case OrderNone:
		if c.DeadLetterOrder == DeadLetterPark {
			errs = append(errs, errors.New("relay.order: none cannot hold relay.dead_letter_order: park (a dead letter's later messages are already sent); set relay.dead_letter_order: pass"))
		}
	default:
		errs = append(errs, fmt.Errorf("relay.order %q is not one of aggregate, none", c.Order))
	}
	switch c.Behind {
	case BehindSpill, BehindHold:
	default:
		errs = append(errs, fmt.Errorf("relay.behind %q is not one of spill, hold", c.Behind))
	}
	return errors.Join(errs...)
}

// cloudEvents reports whether a message may be a CloudEvent: the
// envelope's format or a route's is one of the cloudevents formats.
func (c Config) cloudEvents() bool {
	ce := func(f Format) bool { return f == FormatCloudEvents || f == FormatCloudEventsBinary }
	if ce(c.Envelope.Format) {
		return true
	}
	for _, r := range c.Rules.Routes {
		if ce(Format(r.Format)) {
			return true
		}
	}
	return false
}

// Docs describes the relay section's keys for the configuration reference;
// a test fails when a key has no line here or a line has no key.
func (Config) Docs() map[string]string {
	return map[string]string{
		"max_inflight":       "messages handed to the broker and not yet acknowledged (backpressure)",
		"max_inflight_bytes": "bytes of such messages",
		"max_attempts":       "refusals (permanent rejections) of a message by the broker before it is dead-lettered; retryable failures are retried without limit and do not count",
		"order":              "`aggregate`: first deliveries of an aggregate in commit order through retries and dead letters (one message per aggregate at the broker at a time; Kafka pipelines and holds an aggregate while a failure is handled); `none`: no gate, an aggregate's messages are in flight together up to the window, a retry or a dead letter can reorder them, and it requires `dead_letter_order: pass`",
		"behind":             "with several sinks, what a sink that falls behind does once it holds its share of the in-flight bound: `spill`: its further messages are stored in `outboxrelay.spilled` and delivered from there in order when it catches up, so the other sinks and the slot go on; `hold`: the stream waits for it, and every sink and the slot with it",
		"dead_letter_order":  "`park`: the later messages of a dead letter's aggregate wait behind it in `outboxrelay.parked` until `dlq replay` publishes the chain in order; `pass`: they are published, leaving a gap",
	}
}

// WithDefaults returns o with every zero field set to its default.
func (o Outbox) WithDefaults() Outbox {
	if o.Columns == (Columns{}) {
		o.Columns = DefaultColumns()
	}
	o.MessagePrefix = cmp.Or(o.MessagePrefix, "outboxrelay")
	return o
}

// Validate reports a required column without a name.
func (o Outbox) Validate() error {
	var errs []error
	c := o.Columns
	for _, k := range []struct{ key, name string }{{"id", c.ID}, {"aggregate_type", c.AggregateType},
		{"aggregate_id", c.AggregateID}, {"event_type", c.EventType}, {"payload", c.Payload}} {
		if k.name == "" {
			errs = append(errs, fmt.Errorf("postgres.columns.%s must name a column", k.key))
		}
	}
	for _, h := range o.HeaderColumns {
		switch {
		case h == "":
			errs = append(errs, errors.New("postgres.header_columns has an empty column name"))
		case envelope.Reserved(h):
			errs = append(errs, fmt.Errorf("postgres.header_columns: %q is a header name the relay owns (%s); rename the column or leave it out", h, envelope.ReservedAs(h)))
		}
	}
	errs = append(errs, o.envelopeColumnsError(false))
	return errors.Join(errs...)
}

// envelopeColumnsError reports a name of EnvelopeColumns that would
// collide with a field of the envelope, or of a CloudEvent when
// cloudEvents, or that is there twice.
func (o Outbox) envelopeColumnsError(cloudEvents bool) error {
	var errs []error
	seen := map[string]bool{}
	for _, name := range o.EnvelopeColumns {
		if err := envelope.FieldNameError(name, cloudEvents); err != nil {
			how := "rename the column in a view, or leave it out"
			if cloudEvents {
				how = "a CloudEvents format (envelope.format or a route's format) is in use; " + how
			}
			errs = append(errs, fmt.Errorf("postgres.envelope_columns: %w; %s", err, how))
		} else if seen[name] {
			errs = append(errs, fmt.Errorf("postgres.envelope_columns: %q is listed twice", name))
		}
		seen[name] = true
	}
	return errors.Join(errs...)
}

// Docs describes Outbox's keys, by their path in the section that embeds it.
func (Outbox) Docs() map[string]string {
	return map[string]string{
		"columns.id":             "column that becomes `message_id`",
		"columns.aggregate_type": "column for the topic / routing key",
		"columns.aggregate_id":   "column for the record key (per-aggregate order)",
		"columns.event_type":     "column for `event_type`",
		"columns.payload":        "payload column: jsonb, json, text or bytea",
		"columns.headers":        "jsonb object of extra broker headers; empty when the table has none",
		"columns.traceparent":    "W3C traceparent (or Debezium `tracingspancontext`); empty when none",
		"columns.schema_version": "integer `schema_version`; empty means 1",
		"columns.created_at":     "timestamptz for `occurred_at` and retention; empty means the commit time",
		"columns.key":            "column for the Kafka record key; empty means `aggregate_id` (Debezium's `table.field.event.key`)",
		"columns.timestamp":      "timestamptz column for the record timestamp (Kafka timestamp, AMQP timestamp, `occurred_at` and CloudEvents `time`); empty means the brokers' own",
		"header_columns":         "further columns sent as broker headers named for the column (Debezium's `table.fields.additional.placement` `header`)",
		"envelope_columns":       "further columns placed into the envelope named for the column, as strings (Debezium's `table.fields.additional.placement` `envelope`): top-level fields of the version 1 envelope (NULL is null), CloudEvents extension attributes (names of a-z and 0-9 only; NULL left out), fields next to `payload` in the debezium format; a name of an envelope field or CloudEvents attribute is refused",
		"message_prefix":         "prefix of table-less `pg_logical_emit_message` events",
	}
}

// WithDefaults returns e with every zero field set to its default.
func (e Envelope) WithDefaults() Envelope {
	e.Format = cmp.Or(e.Format, FormatEnvelope)
	e.CloudEventsSource = cmp.Or(e.CloudEventsSource, "outboxrelay")
	return e
}

// Validate reports an unknown format, or a CloudEvents format without a
// source.
func (e Envelope) Validate() error {
	switch e.Format {
	case FormatEnvelope, FormatDebezium:
	case FormatCloudEvents, FormatCloudEventsBinary:
		if e.CloudEventsSource == "" {
			return errors.New("envelope.source must be a URI reference for CloudEvents")
		}
	default:
		return fmt.Errorf("envelope.format %q is not one of envelope, cloudevents, cloudevents-binary, debezium", e.Format)
	}
	return nil
}

// Docs describes Envelope's keys.
func (Envelope) Docs() map[string]string {
	return map[string]string{
		"format": "`envelope`, `cloudevents` (structured), `cloudevents-binary` or `debezium` (Debezium's outbox event router output: the payload as the body, an `id` header)",
		"source": "CloudEvents `source` attribute",
	}
}

// Source is the replication stream the relay consumes (*cdc.Stream).
type Source interface {
	Run(ctx context.Context, h cdc.Handler) error
}

// compileRules compiles c.Rules; nil when there are no routes, and an
// error when unmatched or transform is set without routes.
func (c Config) compileRules() (*rules.Set, error) {
	r := c.Rules
	if len(r.Routes) == 0 {
		if r.Unmatched != "" || r.Transform.Key != "" || len(r.Transform.Headers) > 0 || len(r.Transform.Payload) > 0 {
			return nil, errors.New("unmatched and transform apply to routed rows: add routes")
		}
		return nil, nil
	}
	for i, rt := range r.Routes {
		if rt.Format == "" {
			continue
		}
		if err := (Envelope{Format: Format(rt.Format), CloudEventsSource: c.CloudEventsSource}).Validate(); err != nil {
			return nil, fmt.Errorf("routes[%d] (%s).format: %w", i, rt.Name, err)
		}
	}
	return rules.Compile(r)
}
