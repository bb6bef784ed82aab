package inbox

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Format is the envelope format of the relay that publishes the messages
// (its envelope.format setting).
type Format int

const (
	// FormatAuto recognises each message by its shape: CloudEvents binary
	// mode by a prefixed specversion header, debezium by an id header,
	// otherwise the body's JSON (specversion: a structured CloudEvent;
	// envelope_version: the envelope).
	FormatAuto Format = iota
	// FormatEnvelope is the relay's own JSON envelope (envelope.format
	// envelope, the default).
	FormatEnvelope
	// FormatCloudEvents is a CloudEvent in structured content mode.
	FormatCloudEvents
	// FormatCloudEventsBinary is a CloudEvent in binary content mode: the
	// payload as the body, the attributes as prefixed headers.
	FormatCloudEventsBinary
	// FormatDebezium is what Debezium's outbox event router emits: the
	// payload as the body, the message id in the id header, the aggregate
	// id as the record key.
	FormatDebezium
)

func (f Format) String() string {
	switch f {
	case FormatAuto:
		return "auto"
	case FormatEnvelope:
		return "envelope"
	case FormatCloudEvents:
		return "cloudevents"
	case FormatCloudEventsBinary:
		return "cloudevents-binary"
	case FormatDebezium:
		return "debezium"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// Raw is a message as a broker delivered it, independent of the broker: a
// runner fills it from a Kafka record, an AMQP delivery, a NATS message or
// a Redis stream entry.
type Raw struct {
	// Key is the record key, where the broker has one (Kafka). In the
	// debezium and CloudEvents binary formats it is the aggregate id.
	Key []byte
	// Value is the message body.
	Value []byte
	// Headers are the broker headers. Protocol properties that carry the
	// relay's values go in under the relay's header names: an AMQP runner
	// puts message-id in message_id, type in event_type and content-type in
	// content-type.
	Headers map[string]string
}

// Source says where in PostgreSQL a message came from, as far as its format
// tells: the envelope carries all of it, a CloudEvent only its source URI,
// the debezium format nothing.
type Source struct {
	Database    string
	Table       string // schema.name, or "" for a table-less message
	LSN         string // as PostgreSQL writes it, "X/X"
	CommitLSN   string
	XID         uint32
	CommittedAt time.Time
	// URI is the CloudEvents source attribute.
	URI string
}

// Message is one decoded outbox message.
type Message struct {
	// ID is the message_id: a UUID the outbox library generated, stable
	// across every redelivery. It is the dedupe key.
	ID            string
	AggregateType string // "" when the format and broker do not carry it
	AggregateID   string
	EventType     string
	SchemaVersion int
	OccurredAt    time.Time // zero when the format does not carry it
	Traceparent   string
	Tracestate    string
	// Headers are the outbox row's headers; a non-string JSON value is
	// carried as its JSON text.
	Headers map[string]string
	// Payload is the row's payload: JSON text when ContentType is
	// application/json, else the stored bytes.
	Payload     []byte
	ContentType string
	Source      Source
	// Format is the format the message arrived in.
	Format Format
	// Raw is the delivery Decode read the message from; the inbox stores it
	// with a dead letter or a parked message, and Replay decodes it again.
	Raw Raw
}

// ErrUndecodable is wrapped by every Decode error: the message is not an
// outboxrelay message in the expected format. Receive dead-letters such a
// message at once.
var ErrUndecodable = errors.New("undecodable message")

const contentTypeJSON = "application/json"

// Decode decodes raw in format f (FormatAuto recognises it). An error wraps
// ErrUndecodable and says what is wrong; a message without a message id is
// always an error, because the inbox could not dedupe it. Decode is pure
// and safe for concurrent use; the Message shares no memory with raw except
// Payload, which may point into raw.Value.
func Decode(f Format, raw Raw) (Message, error) {
	if f == FormatAuto {
		f = detect(raw)
	}
	var m Message
	var err error
	switch f {
	case FormatEnvelope, FormatCloudEvents:
		m, err = decodeJSON(f, raw)
	case FormatCloudEventsBinary:
		m, err = decodeBinary(raw)
	case FormatDebezium:
		m, err = decodeDebezium(raw)
	default:
		err = fmt.Errorf("unknown format %v", f)
	}
	if err == nil && m.ID == "" {
		err = errors.New("no message id")
	}
	if err == nil {
		err = storableText(m)
	}
	if err != nil {
		return Message{}, fmt.Errorf("%w (%v): %v", ErrUndecodable, f, err)
	}
	m.Format = f
	m.Raw = raw
	return m, nil
}

// maxIndexedText bounds the message id, aggregate type and aggregate id:
// they are keys of the inbox's btree indexes, whose entries hold about
// 2.7 kB (PostgreSQL refuses a longer one, on every redelivery).
const maxIndexedText = 1000

// storableText checks the fields the inbox keeps in text columns:
// PostgreSQL's text holds valid UTF-8 without NUL bytes, and a message
// whose id it cannot store could be neither recorded nor dead-lettered
// under that id, nor one too long for an index.
func storableText(m Message) error {
	for _, f := range []struct{ name, v string }{{"message id", m.ID}, {"aggregate type", m.AggregateType},
		{"aggregate id", m.AggregateID}, {"event type", m.EventType}} {
		if f.name != "event type" && len(f.v) > maxIndexedText {
			return fmt.Errorf("%s is %d bytes, longer than the %d the inbox's indexes hold", f.name, len(f.v), maxIndexedText)
		}
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%s %q is not UTF-8 text without NUL bytes", f.name, f.v)
		}
	}
	return nil
}

// The prefixes of CloudEvents attributes in binary mode, per protocol
// binding: Kafka and Redis, NATS, AMQP.
var cePrefixes = []string{"ce_", "ce-", "cloudEvents:"}

func ceAttr(h map[string]string, name string) (string, bool) {
	for _, p := range cePrefixes {
		if v, ok := h[p+name]; ok {
			return v, true
		}
	}
	return "", false
}

func detect(raw Raw) Format {
	if _, ok := ceAttr(raw.Headers, "specversion"); ok {
		return FormatCloudEventsBinary
	}
	if _, ok := raw.Headers["id"]; ok {
		return FormatDebezium
	}
	// A structured CloudEvent starts with specversion, as the relay writes
	// it; anything else JSON is read as the envelope, which then says what
	// is missing.
	if bytes.HasPrefix(bytes.TrimLeft(raw.Value, " \t\r\n"), []byte(`{"specversion"`)) {
		return FormatCloudEvents
	}
	return FormatEnvelope
}

// wire holds the fields of the envelope and of a structured CloudEvent.
type wire struct {
	// envelope
	EnvelopeVersion *int            `json:"envelope_version"`
	MessageID       string          `json:"message_id"`
	EventType       string          `json:"event_type"`
	SchemaVersion   int             `json:"schema_version"`
	AggregateType   string          `json:"aggregate_type"`
	AggregateID     string          `json:"aggregate_id"`
	OccurredAt      string          `json:"occurred_at"`
	Traceparent     string          `json:"traceparent"`
	Headers         json.RawMessage `json:"headers"`
	Source          json.RawMessage `json:"source"` // an object; a string in a CloudEvent
	Payload         json.RawMessage `json:"payload"`
	PayloadBase64   *string         `json:"payload_base64"`
	ContentType     string          `json:"content_type"`
	// CloudEvents
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	PartitionKey    string          `json:"partitionkey"`
	SchemaVersionCE int             `json:"schemaversion"`
	Data            json.RawMessage `json:"data"`
	DataBase64      *string         `json:"data_base64"`
}

type wireSource struct {
	Database    string `json:"database"`
	Table       string `json:"table"`
	LSN         string `json:"lsn"`
	CommitLSN   string `json:"commit_lsn"`
	XID         uint32 `json:"xid"`
	CommittedAt string `json:"committed_at"`
}

func decodeJSON(f Format, raw Raw) (Message, error) {
	// encoding/json reads a byte that is not UTF-8 as U+FFFD: two ids that
	// differ only there would be one id, the second message a duplicate.
	if !utf8.Valid(raw.Value) {
		return Message{}, errors.New("body is not UTF-8 JSON")
	}
	var w wire
	if err := json.Unmarshal(raw.Value, &w); err != nil {
		return Message{}, fmt.Errorf("body is not JSON: %v", err)
	}
	m := Message{Tracestate: raw.Headers["tracestate"]}
	var err error
	if f == FormatCloudEvents {
		if w.SpecVersion != "1.0" {
			return Message{}, fmt.Errorf("specversion is %q, want 1.0", w.SpecVersion)
		}
		m.ID, m.EventType, m.SchemaVersion = w.ID, w.Type, w.SchemaVersionCE
		m.AggregateID = w.Subject
		if m.AggregateID == "" {
			m.AggregateID = w.PartitionKey
		}
		m.AggregateType = raw.Headers["aggregate_type"]
		m.Traceparent = w.Traceparent
		if len(w.Source) > 0 {
			if err := json.Unmarshal(w.Source, &m.Source.URI); err != nil {
				return Message{}, fmt.Errorf("source is not a string: %v", err)
			}
		}
		m.Headers = rowHeaders(raw.Headers)
		if m.OccurredAt, err = parseTime(w.Time); err != nil {
			return Message{}, fmt.Errorf("time: %v", err)
		}
		m.Payload, m.ContentType, err = data(w.Data, w.DataBase64, w.DataContentType)
		if err != nil {
			return Message{}, fmt.Errorf("data_base64: %v", err)
		}
		return m, nil
	}
	if w.EnvelopeVersion == nil {
		return Message{}, errors.New("no envelope_version: not an outboxrelay envelope")
	}
	if *w.EnvelopeVersion != 1 {
		return Message{}, fmt.Errorf("envelope_version %d is newer than this inbox reads (1); upgrade the inbox library", *w.EnvelopeVersion)
	}
	m.ID, m.EventType, m.SchemaVersion = w.MessageID, w.EventType, w.SchemaVersion
	m.AggregateType, m.AggregateID = w.AggregateType, w.AggregateID
	m.Traceparent = w.Traceparent
	if m.OccurredAt, err = parseTime(w.OccurredAt); err != nil {
		return Message{}, fmt.Errorf("occurred_at: %v", err)
	}
	if m.Headers, err = objectHeaders(w.Headers); err != nil {
		return Message{}, fmt.Errorf("headers: %v", err)
	}
	if len(w.Source) > 0 && string(w.Source) != "null" {
		var s wireSource
		if err := json.Unmarshal(w.Source, &s); err != nil {
			return Message{}, fmt.Errorf("source: %v", err)
		}
		m.Source = Source{Database: s.Database, Table: s.Table, LSN: s.LSN, CommitLSN: s.CommitLSN, XID: s.XID}
		if m.Source.CommittedAt, err = parseTime(s.CommittedAt); err != nil {
			return Message{}, fmt.Errorf("source.committed_at: %v", err)
		}
	}
	ct := contentTypeJSON
	if w.PayloadBase64 != nil {
		ct = w.ContentType
	}
	if m.Payload, m.ContentType, err = data(w.Payload, w.PayloadBase64, ct); err != nil {
		return Message{}, fmt.Errorf("payload_base64: %v", err)
	}
	return m, nil
}

// data returns the payload of a JSON body: the embedded JSON (nil for an
// absent or null one), else the decoded base64.
func data(inline json.RawMessage, b64 *string, contentType string) ([]byte, string, error) {
	if b64 != nil {
		p, err := base64.StdEncoding.DecodeString(*b64)
		return p, contentType, err
	}
	if len(inline) == 0 || string(inline) == "null" {
		return nil, contentTypeJSON, nil
	}
	return inline, contentTypeJSON, nil
}

func decodeBinary(raw Raw) (Message, error) {
	attr := func(name string) string { v, _ := ceAttr(raw.Headers, name); return v }
	if v := attr("specversion"); v != "1.0" {
		return Message{}, fmt.Errorf("specversion header is %q, want 1.0", v)
	}
	m := Message{
		ID:            attr("id"),
		EventType:     attr("type"),
		AggregateID:   attr("subject"),
		AggregateType: raw.Headers["aggregate_type"],
		Traceparent:   attr("traceparent"),
		Tracestate:    raw.Headers["tracestate"],
		Headers:       rowHeaders(raw.Headers),
		Payload:       raw.Value,
		ContentType:   contentType(raw.Headers),
		Source:        Source{URI: attr("source")},
	}
	if m.AggregateID == "" {
		m.AggregateID = attr("partitionkey")
	}
	if m.Traceparent == "" {
		m.Traceparent = raw.Headers["traceparent"]
	}
	var err error
	if v := attr("schemaversion"); v != "" {
		if m.SchemaVersion, err = strconv.Atoi(v); err != nil {
			return Message{}, fmt.Errorf("schemaversion %q is not an integer", v)
		}
	}
	if m.OccurredAt, err = parseTime(attr("time")); err != nil {
		return Message{}, fmt.Errorf("time: %v", err)
	}
	return m, nil
}

func decodeDebezium(raw Raw) (Message, error) {
	m := Message{
		ID:            raw.Headers["id"],
		EventType:     raw.Headers["event_type"],
		AggregateType: raw.Headers["aggregate_type"],
		AggregateID:   string(raw.Key),
		Traceparent:   raw.Headers["traceparent"],
		Tracestate:    raw.Headers["tracestate"],
		Headers:       rowHeaders(raw.Headers),
		Payload:       raw.Value,
		ContentType:   contentType(raw.Headers),
	}
	if v, ok := raw.Headers["aggregate_id"]; ok {
		m.AggregateID = v
	}
	if m.ID == "" {
		return Message{}, errors.New("no id header")
	}
	return m, nil
}

func contentType(h map[string]string) string {
	if v := h["content-type"]; v != "" {
		return v
	}
	return contentTypeJSON
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// objectHeaders reads the envelope's headers object.
func objectHeaders(b json.RawMessage) (map[string]string, error) {
	if len(b) == 0 || string(b) == "null" {
		return map[string]string{}, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return out, nil
}

// rowHeaders returns the broker headers that are the row's own: all but
// the names the relay reserves for itself (its README lists them).
func rowHeaders(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if !reserved(k) {
			out[k] = v
		}
	}
	return out
}

var (
	reservedNames    = []string{"id", "message_id", "event_type", "aggregate_id", "aggregate_type", "traceparent", "tracestate", "content-type", "content_type"}
	reservedPrefixes = []string{"ce_", "ce-", "cloudevents:", "cloudevents_", "x-outboxrelay-"}
)

func reserved(name string) bool {
	for _, r := range reservedNames {
		if strings.EqualFold(name, r) {
			return true
		}
	}
	for _, p := range reservedPrefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			return true
		}
	}
	return false
}

// envelopeOf encodes m as an envelope, for a Message that did not come from
// Decode and must be stored (Replay decodes it again).
func envelopeOf(m Message) []byte {
	type source struct {
		Database    string `json:"database"`
		Table       string `json:"table"`
		LSN         string `json:"lsn,omitempty"`
		CommitLSN   string `json:"commit_lsn,omitempty"`
		XID         uint32 `json:"xid"`
		CommittedAt string `json:"committed_at,omitempty"`
	}
	e := struct {
		Version       int               `json:"envelope_version"`
		MessageID     string            `json:"message_id"`
		EventType     string            `json:"event_type"`
		SchemaVersion int               `json:"schema_version"`
		AggregateType string            `json:"aggregate_type"`
		AggregateID   string            `json:"aggregate_id"`
		OccurredAt    string            `json:"occurred_at,omitempty"`
		Traceparent   string            `json:"traceparent,omitempty"`
		Headers       map[string]string `json:"headers"`
		Source        source            `json:"source"`
		Payload       json.RawMessage   `json:"payload,omitempty"`
		PayloadBase64 *string           `json:"payload_base64,omitempty"`
		ContentType   string            `json:"content_type,omitempty"`
	}{
		Version: 1, MessageID: m.ID, EventType: m.EventType, SchemaVersion: m.SchemaVersion,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, Traceparent: m.Traceparent,
		Headers: m.Headers,
		Source: source{Database: m.Source.Database, Table: m.Source.Table, LSN: m.Source.LSN,
			CommitLSN: m.Source.CommitLSN, XID: m.Source.XID},
	}
	if !m.OccurredAt.IsZero() {
		e.OccurredAt = m.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	if !m.Source.CommittedAt.IsZero() {
		e.Source.CommittedAt = m.Source.CommittedAt.UTC().Format(time.RFC3339Nano)
	}
	if len(m.Payload) > 0 {
		if (m.ContentType == "" || m.ContentType == contentTypeJSON) && json.Valid(m.Payload) {
			e.Payload = m.Payload
		} else {
			b := base64.StdEncoding.EncodeToString(m.Payload)
			e.PayloadBase64, e.ContentType = &b, m.ContentType
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("inbox: encode an envelope: %v", err)) // only strings, ints and valid JSON
	}
	return b
}
