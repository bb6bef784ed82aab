// Package envelope defines the versioned message envelope that outboxrelay
// publishes for every committed outbox row, and its JSON encoding.
//
// Encoding is pure: no I/O, no clocks, no randomness. The same Message always
// encodes to the same bytes, so a redelivered row is byte-identical.
package envelope

import "time"

// Version is the envelope_version written into every envelope.
const Version = 1

// PayloadFormat says how Message.Payload was stored in the outbox row.
type PayloadFormat uint8

const (
	// PayloadJSON is JSON text that PostgreSQL already validated (json and
	// jsonb columns). It is embedded verbatim.
	PayloadJSON PayloadFormat = iota
	// PayloadText is text of unknown shape (text, varchar). It is embedded as
	// JSON when it is valid JSON, otherwise sent base64 in payload_base64 with
	// content_type text/plain; charset=utf-8.
	PayloadText
	// PayloadBinary is raw bytes (bytea). Embedded when they are valid JSON,
	// otherwise sent base64 in payload_base64 with content_type
	// application/octet-stream.
	PayloadBinary
)

// Header is one broker header taken from the outbox row's headers object.
// Values are strings: non-string JSON values are carried as their JSON text.
type Header struct {
	Key   string
	Value string
}

// Source says where in PostgreSQL a message came from.
type Source struct {
	Database string
	// Table is schema.name, or "" for a table-less logical decoding message.
	Table       string
	LSN         uint64 // WAL position of the row, written as "X/X"
	CommitLSN   uint64 // WAL position of the commit record, written as "X/X"
	XID         uint32
	CommittedAt time.Time
}

// Message is the content of one envelope, version 1.
type Message struct {
	MessageID     string
	EventType     string
	SchemaVersion int
	AggregateType string
	AggregateID   string
	OccurredAt    time.Time
	// TraceID is 32 lowercase hex digits; Traceparent the W3C traceparent
	// it belongs to. Use Trace to derive both from the row.
	TraceID     string
	Traceparent string
	// Headers is the row's headers JSON object text; nil or empty means {}.
	Headers       []byte
	Source        Source
	Payload       []byte
	PayloadFormat PayloadFormat
}
