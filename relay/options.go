package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
)

// Options are the parts the relay calls out to, as against Config, which is
// plain data. Every field is optional; each says what its absence means.
type Options struct {
	// Checkpoint durably records the positions the relay confirms and
	// checks the slot against the record when a session starts
	// (internal/store Checkpoint). Nil: nothing is recorded or checked.
	Checkpoint Checkpoint
	// DeadLetters stores dead letters. Nil: a message that must be
	// dead-lettered stops the relay with an error instead.
	DeadLetters DeadLetters
	// Parking stores the aggregates parked behind a dead letter
	// (Config.DeadLetterOrder park). Nil: later messages pass, whatever
	// DeadLetterOrder says. A row that cannot be built into a message
	// (invalid headers, say) is dead-lettered through DeadLetters and
	// parks nothing.
	Parking Parking
	// Spill stores the messages of a sink that fell behind the others
	// when the relay feeds several (Config.Behind BehindSpill). Nil: such a
	// sink holds the stream, as with BehindHold.
	Spill Spill
	// Resolver maps the relations pgoutput announces to outbox tables.
	// Nil: a relation in Config.Tables is itself, any other stops the
	// relay.
	Resolver Resolver
	// Validator checks each message's content as the message is built.
	// Nil: no check.
	Validator Validator
	// Tracer, when set, starts an OpenTelemetry producer span for every
	// message, child of the row's traceparent when it is valid and a root
	// otherwise, and the message carries that span's context (traceparent
	// and tracestate) instead of the row's; see startSpan. Nil, or a tracer
	// that records nothing: no spans, and messages carry the row's trace
	// context, or a derived one that is not flagged sampled.
	Tracer trace.Tracer
	// Hooks observe the pipeline.
	Hooks Hooks
}

// Checkpoint records positions durably. Both methods are called from the
// relay's goroutines, never concurrently with themselves.
type Checkpoint interface {
	// Confirm durably records lsn before the relay confirms it to
	// PostgreSQL.
	Confirm(ctx context.Context, lsn cdc.LSN) error
	// CheckSlot checks the slot's confirmed position against the record when
	// a session starts.
	CheckSlot(ctx context.Context, slotConfirmed cdc.LSN) error
}

// DeadLetters stores messages the broker will never take.
type DeadLetters interface {
	// Add must return only once m is durably stored; the relay confirms
	// past the message after that.
	Add(ctx context.Context, m *Message) error
}

// DeadLetterFunc is a DeadLetters of one function.
type DeadLetterFunc func(ctx context.Context, m *Message) error

// Add calls f.
func (f DeadLetterFunc) Add(ctx context.Context, m *Message) error { return f(ctx, m) }

// Resolver maps a relation pgoutput announced to the outbox table whose
// inserts it carries (a partition to its root, say), or to "" for a table
// the operator chose to skip. An error stops the relay before it confirms
// the transaction. Called from the stream goroutine, once per announcement.
type Resolver interface {
	Resolve(ctx context.Context, rel *cdc.Relation) (string, error)
}

// Validator checks each message's content (its payload against the schema
// of its event type and version, say) as the message is built. An error
// dead-letters the message as an invalid row is: never published, with the
// error. Called from the stream goroutine; em must not be kept.
type Validator interface {
	Validate(em *envelope.Message) error
}

// ValidateFunc is a Validator of one function.
type ValidateFunc func(em *envelope.Message) error

// Validate calls f.
func (f ValidateFunc) Validate(em *envelope.Message) error { return f(em) }

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
	// Spilled is called once n messages of the sink named sink, which is
	// behind, are stored in Options.Spill.
	Spilled func(sink string, n int)
	// Filtered is called for every row the routing rules drop, with the
	// route label (Message.Filtered). Called from the stream goroutine.
	Filtered func(route string)
	// Skipped is called for every insert into a table the operator chose
	// not to relay (Options.Resolver returned "").
	Skipped func(table string)
	// ReservedHeaderDropped is called once for every row header the relay
	// drops from m because its name is reserved; reserved is the reserved
	// name or prefix it matched (envelope.ReservedAs), not the row's
	// spelling. Called from the stream goroutine.
	ReservedHeaderDropped func(m *Message, reserved string)
	// Republished is called each time the relay hands m to the sink again
	// when the broker may already hold it, with why (RepublishedRetry);
	// see republish.go.
	Republished func(m *Message, reason string)
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
		if f, g := j.Spilled, h.Spilled; f != nil && g != nil {
			j.Spilled = func(sink string, n int) { f(sink, n); g(sink, n) }
		} else if g != nil {
			j.Spilled = g
		}
		if f, g := j.Filtered, h.Filtered; f != nil && g != nil {
			j.Filtered = func(r string) { f(r); g(r) }
		} else if g != nil {
			j.Filtered = g
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
		if f, g := j.Republished, h.Republished; f != nil && g != nil {
			j.Republished = func(m *Message, reason string) { f(m, reason); g(m, reason) }
		} else if g != nil {
			j.Republished = g
		}
	}
	return j
}
