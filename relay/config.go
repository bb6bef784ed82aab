package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
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

// DeadLetterFunc stores a message the broker will never take. It must return
// only once the message is durably stored; the relay confirms past the
// message after that.
type DeadLetterFunc func(ctx context.Context, m *Message) error

// Hooks observe the pipeline (metrics, tests). Every field is optional. Hooks
// are called from sink goroutines and must not block.
type Hooks struct {
	// Published is called once the broker has acknowledged m.
	Published func(m *Message, ackedAt time.Time)
	// PublishFailed is called for every failed attempt.
	PublishFailed func(m *Message, err error)
	// DeadLettered is called once m is stored as a dead letter.
	DeadLettered func(m *Message)
	// Parked is called once m is stored behind its aggregate's dead letter.
	Parked func(m *Message)
	// Skipped is called for every insert into a table the operator chose
	// not to relay (Config.Resolve returned "").
	Skipped func(table string)
	// ReservedHeaderDropped is called once for every row header the relay
	// drops from m because its name is reserved; reserved is the reserved
	// name or prefix it matched (envelope.ReservedAs), not the row's
	// spelling. Called from the stream goroutine.
	ReservedHeaderDropped func(m *Message, reserved string)
}

// JoinHooks returns hooks that call the hooks set in hs, each kind in the
// order of hs. A kind none of hs sets stays nil; one that a single Hooks
// sets is that hook itself.
func JoinHooks(hs ...Hooks) Hooks {
	var j Hooks
	for _, h := range hs {
		if f, g := j.Published, h.Published; f != nil && g != nil {
			j.Published = func(m *Message, at time.Time) { f(m, at); g(m, at) }
		} else if g != nil {
			j.Published = g
		}
		if f, g := j.PublishFailed, h.PublishFailed; f != nil && g != nil {
			j.PublishFailed = func(m *Message, err error) { f(m, err); g(m, err) }
		} else if g != nil {
			j.PublishFailed = g
		}
		if f, g := j.DeadLettered, h.DeadLettered; f != nil && g != nil {
			j.DeadLettered = func(m *Message) { f(m); g(m) }
		} else if g != nil {
			j.DeadLettered = g
		}
		if f, g := j.Parked, h.Parked; f != nil && g != nil {
			j.Parked = func(m *Message) { f(m); g(m) }
		} else if g != nil {
			j.Parked = g
		}
		if f, g := j.Skipped, h.Skipped; f != nil && g != nil {
			j.Skipped = func(table string) { f(table); g(table) }
		} else if g != nil {
			j.Skipped = g
		}
		if f, g := j.ReservedHeaderDropped, h.ReservedHeaderDropped; f != nil && g != nil {
			j.ReservedHeaderDropped = func(m *Message, reserved string) { f(m, reserved); g(m, reserved) }
		} else if g != nil {
			j.ReservedHeaderDropped = g
		}
	}
	return j
}

// Config configures the pipeline.
type Config struct {
	// Database is written to the envelope's source.database.
	Database string
	// Tables are the outbox tables as schema.name. Empty: every published
	// table. Used only when Resolve is nil.
	Tables []string
	// Resolve maps a relation pgoutput announced to the outbox table whose
	// inserts it carries (a partition to its root, say), or to "" for a
	// table the operator chose to skip. An error stops the relay before it
	// confirms the transaction. Nil: a relation in Tables is itself, any
	// other stops the relay. Called from the stream goroutine, once per
	// announcement.
	Resolve func(ctx context.Context, rel *cdc.Relation) (string, error)
	Columns Columns
	// Format is FormatEnvelope (default), FormatCloudEvents (structured
	// content mode), FormatCloudEventsBinary or FormatDebezium.
	Format Format
	// CloudEventsSource is the CloudEvents source attribute.
	CloudEventsSource string
	// MessagePrefix is the prefix of table-less outbox messages
	// (pg_logical_emit_message); default "outboxrelay".
	MessagePrefix string
	// MaxInFlight and MaxInFlightBytes bound the messages handed to the sink
	// and not yet acknowledged (defaults 10000 and 64 MiB).
	MaxInFlight      int
	MaxInFlightBytes int64
	// MaxAttempts is how often a message the broker rejects permanently is
	// tried before it is dead-lettered (default 5). Retryable failures are
	// retried without limit.
	MaxAttempts int
	// RetryMin and RetryMax bound the exponential retry backoff (defaults 100ms, 30s).
	RetryMin, RetryMax time.Duration
	// DeadLetter stores dead letters. When nil, a message that must be
	// dead-lettered stops the relay with an error instead.
	DeadLetter DeadLetterFunc
	// DeadLetterOrder is DeadLetterPark (default) or DeadLetterPass. It
	// applies to messages the broker refused; a row that cannot be built
	// into a message (invalid headers, say) is dead-lettered through
	// DeadLetter and parks nothing. Parking stores the parked aggregates;
	// when it is nil, later messages pass whatever DeadLetterOrder says.
	DeadLetterOrder DeadLetterOrder
	Parking         Parking
	// Checkpoint durably records a position before the relay confirms it to
	// PostgreSQL (internal/store Checkpoint.Confirm); Verify checks the slot against the
	// record when a session starts (Checkpoint.Verify). Both optional.
	Checkpoint func(ctx context.Context, lsn cdc.LSN) error
	Verify     func(ctx context.Context, slotConfirmed cdc.LSN) error
	// CheckpointInterval is how often a new position is recorded (default
	// 100ms): a position is recorded only when the watermark moved, so an
	// idle relay writes nothing, a busy one ten small upserts a second, and
	// a crash repeats about a tenth of a second of acknowledged messages
	// rather than a second of them.
	CheckpointInterval time.Duration
	Hooks              Hooks
	// Validate, when set, checks each message's content (its payload
	// against the schema of its event type and version, say) as the
	// message is built. An error dead-letters the message as an invalid
	// row is: never published, with the error. Called from the stream
	// goroutine; em must not be kept.
	Validate func(em *envelope.Message) error
	// Tracer, when set, starts an OpenTelemetry producer span for every
	// message, child of the row's traceparent when it is valid and a root
	// otherwise, and the message carries that span's context (traceparent
	// and tracestate) instead of the row's; see startSpan. Nil, or a tracer
	// that records nothing: no spans, and messages carry the row's trace
	// context, or a derived one that is not flagged sampled.
	Tracer trace.Tracer
	// MessagingSystem is the spans' messaging.system attribute: the sink's
	// name (kafka, rabbitmq, nats, redis).
	MessagingSystem string
}

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

func (c *Config) setDefaults() {
	if c.Columns == (Columns{}) {
		c.Columns = DefaultColumns()
	}
	if c.MessagePrefix == "" {
		c.MessagePrefix = "outboxrelay"
	}
	if c.Format == "" {
		c.Format = FormatEnvelope
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 10000
	}
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = 64 << 20
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = 100 * time.Millisecond
	}
	if c.DeadLetterOrder == "" {
		c.DeadLetterOrder = DeadLetterPark
	}
}

// Source is the replication stream the relay consumes (*cdc.Stream).
type Source interface {
	Run(ctx context.Context, h cdc.Handler) error
}
