// Package envelope defines the versioned message envelope that outboxrelay
// publishes for every committed outbox row, and its JSON encoding.
//
// Encoding is pure: no I/O, no clocks, no randomness. The same Message always
// encodes to the same bytes, so a redelivered row is byte-identical. The
// package also parses the PostgreSQL text that becomes a Message: timestamptz
// values (ParseTimestamp), the headers object (ParseHeaders), W3C trace
// context (Trace) and table-less outbox messages (ParseEmitted).
//
// Every function in this package is safe for concurrent use; a Message may
// be encoded by several goroutines at once as long as none modifies it.
package envelope

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

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

// Content types written next to payload_base64.
const (
	ContentTypeText   = "text/plain; charset=utf-8"
	ContentTypeBinary = "application/octet-stream"
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
	// Headers is the row's headers JSON object text; nil, empty or null
	// means {}. It is embedded verbatim, so it must be a JSON object in
	// UTF-8, as a jsonb column that ParseHeaders accepts or ParseEmitted
	// guarantees.
	Headers []byte
	Source  Source
	// Payload is the row's payload; PayloadFormat says how to embed it.
	// A PayloadJSON payload must be valid UTF-8 JSON (PostgreSQL validated
	// it): it is embedded verbatim without a second check, because that
	// check would cost more than the rest of the encoding.
	Payload       []byte
	PayloadFormat PayloadFormat
	// Fields are further columns of the row placed into the envelope
	// (postgres.envelope_columns, Debezium's additional placement
	// envelope): top-level fields of the envelope, extension attributes of
	// a CloudEvent, fields next to "payload" in the debezium format. Their
	// names are checked when the configuration loads (FieldNameError).
	Fields []Field
}

// Field is one column placed into the envelope: its name and its value in
// PostgreSQL's text output; Null for a NULL column, which is JSON null in
// the envelope and left out of a CloudEvent and of the debezium format.
type Field struct {
	Name, Value string
	Null        bool
}

// EnvelopeFields are the top-level fields of the version 1 envelope, which
// a Field may not be named.
var EnvelopeFields = []string{"envelope_version", "message_id", "event_type", "schema_version", "aggregate_type",
	"aggregate_id", "occurred_at", "trace_id", "traceparent", "headers", "source", "payload", "payload_base64", "content_type"}

// CloudEventsAttributes are the context attributes of CloudEvents 1.0 and
// the extensions the relay writes, which a Field may not be named in the
// cloudevents formats.
var CloudEventsAttributes = []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype",
	"dataschema", "data", "data_base64", "traceparent", "tracestate", "partitionkey", "schemaversion"}

// FieldNameError says why name cannot be the name of a Field in the
// envelope and, when cloudEvents, a CloudEvents extension attribute
// (lower-case ASCII letters and digits only, CloudEvents 1.0 "Attribute
// Naming Convention"); nil when it can.
func FieldNameError(name string, cloudEvents bool) error {
	switch {
	case name == "":
		return errors.New("an empty name")
	case slices.Contains(EnvelopeFields, name):
		return fmt.Errorf("%q is a field of the envelope", name)
	case cloudEvents && slices.Contains(CloudEventsAttributes, name):
		return fmt.Errorf("%q is a CloudEvents attribute", name)
	}
	if cloudEvents {
		for _, c := range name {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
				return fmt.Errorf("%q is not a CloudEvents attribute name, which has only lower-case letters a-z and digits 0-9", name)
			}
		}
	}
	return nil
}

// appendFields appends the fields as JSON members, each after a comma;
// with skipNull a NULL one is left out.
func appendFields(dst []byte, fields []Field, skipNull bool) []byte {
	for _, f := range fields {
		if f.Null && skipNull {
			continue
		}
		dst = append(dst, ',')
		dst = appendString(dst, f.Name)
		dst = append(dst, ':')
		if f.Null {
			dst = append(dst, "null"...)
		} else {
			dst = appendString(dst, f.Value)
		}
	}
	return dst
}

func fieldsSize(fields []Field) int {
	n := 0
	for _, f := range fields {
		n += len(f.Name) + len(f.Value) + 8
	}
	return n
}

// timeLayout is the layout of occurred_at and committed_at; AppendJSON
// writes it by hand and falls back to time.Format only for years outside
// 0000-9999.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// fixedSize is about the number of bytes AppendJSON writes besides the
// variable-length fields; it only sizes the buffer.
const fixedSize = 320

// SizeHint returns the capacity of a buffer that AppendJSON, or
// AppendCloudEvent with a source of up to 100 bytes, fills without growing
// it, unless strings in m need escaping. It assumes the larger, base64 form
// of a text or binary payload, as it does not check whether that is JSON.
func (m *Message) SizeHint() int {
	n := fixedSize + len(m.MessageID) + len(m.EventType) + len(m.AggregateType) +
		2*len(m.AggregateID) + len(m.TraceID) + len(m.Traceparent) + len(m.Headers) +
		len(m.Source.Database) + len(m.Source.Table) + len(ContentTypeBinary) + 100
	if m.PayloadFormat == PayloadJSON {
		return n + len(m.Payload)
	}
	return n + base64.StdEncoding.EncodedLen(len(m.Payload))
}

// AppendJSON appends the envelope of m as compact JSON to dst and returns
// the extended buffer. Fields appear in the order of the README's envelope
// (version 1), times in UTC with microseconds, LSNs as PostgreSQL writes
// them.
//
// Strings are escaped exactly as encoding/json escapes them (HTML-safe,
// invalid UTF-8 replaced by U+FFFD), so the result is valid UTF-8 JSON
// whenever Headers and a PayloadJSON Payload meet the preconditions
// documented on Message. Text and binary payloads are checked: they are
// embedded only when they are valid UTF-8 JSON, otherwise sent as
// payload_base64 with content_type. An unknown PayloadFormat is treated as
// PayloadBinary.
//
// AppendJSON does not modify m and allocates only when dst lacks room.
func (m *Message) AppendJSON(dst []byte) []byte {
	payload := trimSpace(m.Payload)
	inline := true
	contentType := ""
	switch m.PayloadFormat {
	case PayloadJSON:
	case PayloadText:
		inline = isJSON(m.Payload)
		contentType = ContentTypeText
	default:
		inline = isJSON(m.Payload)
		contentType = ContentTypeBinary
	}
	headers := trimSpace(m.Headers)
	if string(headers) == "null" { // a jsonb 'null' in the headers column
		headers = nil
	}

	size := fixedSize + len(m.MessageID) + len(m.EventType) + len(m.AggregateType) +
		len(m.AggregateID) + len(m.TraceID) + len(m.Traceparent) + len(headers) +
		len(m.Source.Database) + len(m.Source.Table) + fieldsSize(m.Fields)
	if inline {
		size += len(payload)
	} else {
		size += base64.StdEncoding.EncodedLen(len(m.Payload)) + len(contentType)
	}
	dst = slices.Grow(dst, size)

	dst = append(dst, `{"envelope_version":`...)
	dst = strconv.AppendInt(dst, Version, 10)
	dst = append(dst, `,"message_id":`...)
	dst = appendString(dst, m.MessageID)
	dst = append(dst, `,"event_type":`...)
	dst = appendString(dst, m.EventType)
	dst = append(dst, `,"schema_version":`...)
	dst = strconv.AppendInt(dst, int64(m.SchemaVersion), 10)
	dst = append(dst, `,"aggregate_type":`...)
	dst = appendString(dst, m.AggregateType)
	dst = append(dst, `,"aggregate_id":`...)
	dst = appendString(dst, m.AggregateID)
	dst = append(dst, `,"occurred_at":"`...)
	dst = appendTime(dst, m.OccurredAt)
	dst = append(dst, `","trace_id":`...)
	dst = appendString(dst, m.TraceID)
	dst = append(dst, `,"traceparent":`...)
	dst = appendString(dst, m.Traceparent)
	dst = append(dst, `,"headers":`...)
	if len(headers) == 0 {
		dst = append(dst, "{}"...)
	} else {
		dst = append(dst, headers...)
	}
	dst = append(dst, `,"source":{"database":`...)
	dst = appendString(dst, m.Source.Database)
	dst = append(dst, `,"table":`...)
	dst = appendString(dst, m.Source.Table)
	dst = append(dst, `,"lsn":"`...)
	dst = AppendLSN(dst, m.Source.LSN)
	dst = append(dst, `","commit_lsn":"`...)
	dst = AppendLSN(dst, m.Source.CommitLSN)
	dst = append(dst, `","xid":`...)
	dst = strconv.AppendUint(dst, uint64(m.Source.XID), 10)
	dst = append(dst, `,"committed_at":"`...)
	dst = appendTime(dst, m.Source.CommittedAt)
	dst = append(dst, `"}`...)
	dst = appendFields(dst, m.Fields, false)
	switch {
	case !inline:
		dst = append(dst, `,"payload_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, m.Payload)
		dst = append(dst, `","content_type":"`...)
		dst = append(dst, contentType...) // constant, needs no escaping
		dst = append(dst, '"')
	case len(payload) == 0:
		dst = append(dst, `,"payload":null`...)
	default:
		dst = append(dst, `,"payload":`...)
		dst = append(dst, payload...)
	}
	return append(dst, '}')
}

// isJSON reports whether a text or binary payload can be embedded: it must
// be JSON and, because the envelope is UTF-8, valid UTF-8 (json.Valid alone
// accepts invalid UTF-8 inside strings).
func isJSON(b []byte) bool {
	return utf8.Valid(b) && json.Valid(b)
}

// trimSpace trims JSON whitespace only (not Unicode spaces, which are not
// insignificant in JSON).
func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// appendTime appends t in UTC as 2006-01-02T15:04:05.000000Z. Writing it by
// hand from the Unix time is several times faster than time.AppendFormat.
func appendTime(dst []byte, t time.Time) []byte {
	const (
		minUnix = -62167219200 // 0000-01-01T00:00:00Z
		maxUnix = 253402300799 // 9999-12-31T23:59:59Z
	)
	sec := t.Unix()
	if sec < minUnix || sec > maxUnix {
		return t.UTC().AppendFormat(dst, timeLayout)
	}
	days, rem := sec/86400, int(sec%86400)
	if rem < 0 {
		days, rem = days-1, rem+86400
	}
	year, month, day := civilDate(days)
	us := t.Nanosecond() / 1000
	var b [len(timeLayout)]byte
	put2(b[0:], year/100)
	put2(b[2:], year%100)
	b[4] = '-'
	put2(b[5:], month)
	b[7] = '-'
	put2(b[8:], day)
	b[10] = 'T'
	put2(b[11:], rem/3600)
	b[13] = ':'
	put2(b[14:], rem/60%60)
	b[16] = ':'
	put2(b[17:], rem%60)
	b[19] = '.'
	put2(b[20:], us/10000)
	put2(b[22:], us/100%100)
	put2(b[24:], us%100)
	b[26] = 'Z'
	return append(dst, b[:]...)
}

// civilDate converts days since 1970-01-01 to a proleptic Gregorian date,
// counting in 400-year eras that start on March 1st so that the leap day
// is the last day of a year (Howard Hinnant's days_from_civil, inverted).
func civilDate(days int64) (year, month, day int) {
	z := days + 719468 // days since 0000-03-01
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097                                  // day of era, 0-146096
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // year of era, 0-399
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // day of March-based year, 0-365
	mp := (5*doy + 2) / 153                                // March-based month, 0-11
	day = int(doy - (153*mp+2)/5 + 1)
	month = int(mp + 3)
	if month > 12 {
		month -= 12
	}
	year = int(yoe + era*400)
	if month <= 2 {
		year++
	}
	return year, month, day
}

func put2(b []byte, v int) {
	b[0] = byte('0' + v/10)
	b[1] = byte('0' + v%10)
}
