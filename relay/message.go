package relay

import (
	"errors"
	"time"

	"github.com/jackc/pglogrepl"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/envelope"
)

// Message is one committed outbox row (or table-less logical decoding message)
// wrapped in its envelope, ready for a sink.
//
// A Message is owned by the relay. A sink may read every field and may set
// Destination, but must not keep the Message after it has reported the
// outcome through the done callback passed to Publish.
type Message struct {
	// ID is the message_id (the outbox row id). It is stable across redelivery.
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	// Table is the source table as schema.name, or "" for a table-less message.
	Table string
	// Traceparent is the W3C traceparent of the envelope, always set: the
	// relay's producer span when it records one (Options.Tracer), else the
	// row's, else one derived from ID and not flagged sampled.
	Traceparent string
	// Tracestate is the W3C tracestate that goes with Traceparent: the
	// row's tracestate header when the traceparent is the row's or its
	// child span's, else "".
	Tracestate string
	// Headers are the row's headers, in the order they appear in the row,
	// without those whose names the relay owns (envelope.Reserved).
	Headers []envelope.Header
	// Envelope is the broker message body: the encoded envelope (JSON,
	// UTF-8), a CloudEvent in structured mode, or the bare payload in
	// CloudEvents binary mode.
	Envelope []byte
	// ContentType is the body's media type; "" means application/json.
	ContentType string
	// Attributes are CloudEvents attributes for binary content mode, names
	// without prefix: a sink adds its protocol binding's prefix (ce_ for
	// Kafka, cloudEvents: for AMQP). Empty in the other formats.
	Attributes []envelope.Header
	// Format is the body format the message was built in. The sinks'
	// header mapping adds the headers a format defines (the id header of
	// FormatDebezium).
	Format Format
	// Key is the record key: the aggregate id, or the column
	// Columns.Key names. A sink with record keys uses Key, or AggregateID
	// when Key is empty.
	Key string
	// Timestamp is the record timestamp from the column Columns.Timestamp
	// names; zero when none is configured (the broker's own time).
	Timestamp time.Time
	// Tombstone is a debezium-format message whose payload was NULL: a
	// Kafka record with a null value, an empty body elsewhere, as
	// Debezium's router sends it with route.tombstone.on.empty.payload.
	Tombstone bool
	// CommitTime is the commit time of the source transaction.
	CommitTime time.Time
	// LSN is the WAL position of the row; CommitLSN that of its transaction's commit.
	LSN, CommitLSN pglogrepl.LSN

	// Route is the name of the routing rule (Config.Rules) the message
	// took; "" without rules. RouteDestination is that route's destination
	// template, which the sink renders instead of its own; "" keeps the
	// sink's.
	Route, RouteDestination string
	// Sink is the name of the sink the message goes to (a key of the
	// file's sinks section): its route's, else the first sink's, set by
	// the relay when it dispatches the message. "" with the one sink of a
	// sink section. Dead letters and parked messages record it, so that a
	// replay sends them to the same sink.
	Sink string
	// Filtered is the route label of a row the rules drop
	// (FilteredUnmatched for unmatched: drop): it is counted and its
	// position confirmed, but it is never published. "" otherwise.
	Filtered string

	// Destination is set by the sink to the rendered topic, routing key,
	// subject or stream, for metrics and dead letters.
	Destination string
	// Attempts counts the publish attempts that failed so far, retryable
	// ones included: it sets the retry backoff, and a dead letter records
	// it.
	Attempts int
	// Refusals counts those of Attempts the broker refused for good
	// (Permanent). Config.MaxAttempts is compared with it, not with
	// Attempts: the failures of an outage are retried without limit and use
	// up none of a message's attempts.
	Refusals int
	// FirstFailure and LastFailure are the times of the first and latest failed attempt.
	FirstFailure, LastFailure time.Time
	// LastError is the error of the latest failed attempt.
	LastError error

	tx *txn // set by the relay; nil for a message read back from Options.Spill
	// spillSeq is the message's Spilled.Seq when it was read back from
	// Options.Spill, else 0.
	spillSeq int64
	// queued says the message went through its sink's queue, and so counts
	// in the sink's held messages until it is complete (publisher.enqueue).
	queued bool
	seq    uint64     // publish order
	buf    *[]byte    // non-nil: Envelope returns to the buffer pool in it once m is complete
	span   trace.Span // the relay's producer span, when it records one
}

// FilteredUnmatched is Message.Filtered for a row no route matches when
// the rules say unmatched: drop.
const FilteredUnmatched = "unmatched"

// ErrInvalid marks the error of a message the relay could not build from
// its row (a required column empty, headers that are not an object, a
// payload the schema folder refuses): it is dead-lettered without being
// published, and a replay of the dead letter refuses it unless an operator
// forces it (store.DeadLetters.Replay).
var ErrInvalid = errors.New("invalid outbox message")

// PermanentError marks a publish failure that retrying will not fix: the
// broker will never take this message as it is (too large, unroutable, an
// invalid destination). The relay retries it a configured number of times
// and then dead-letters it.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError. It returns nil for a nil err.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// countRefusal counts err, the error of m's latest failed attempt, in
// m.Refusals when the broker refused m for good.
func (m *Message) countRefusal(err error) {
	if !Retryable(err) {
		m.Refusals++
	}
}

// refusedEnough reports whether m's latest failure is a refusal and the
// broker has refused m maxAttempts times: then m is dead-lettered.
func (m *Message) refusedEnough(maxAttempts int) bool {
	return !Retryable(m.LastError) && m.Refusals >= maxAttempts
}

// Retryable reports whether a publish error is worth retrying indefinitely.
// This is the one place that decides: sinks mark the failures the broker
// will never accept with Permanent; everything else (broker unavailable,
// not leader, timeouts, connection resets) is retryable.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var p *PermanentError
	return !errors.As(err, &p)
}
