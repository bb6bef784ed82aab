package envelope

import (
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// CloudEvents 1.0 (https://github.com/cloudevents/spec, version 1.0.2) as an
// envelope format: the same message as a CloudEvent, for consumers built on
// a CloudEvents SDK.
//
// Attributes:
//
//	specversion     "1.0"
//	id              message_id
//	source          the configured source, a URI-reference (for example
//	                "/outboxrelay/shop" or "urn:outboxrelay:shop"); the
//	                caller checks that it is not empty
//	type            event_type
//	subject         aggregate_id (left out when empty: the spec forbids
//	                an empty subject)
//	time            occurred_at, RFC 3339 in UTC with microseconds
//	datacontenttype application/json when the payload is embedded as JSON
//	                (as in AppendJSON), otherwise the content_type
//	                AppendJSON writes next to payload_base64
//	traceparent     the W3C traceparent (distributed tracing extension),
//	                left out when empty
//	partitionkey    aggregate_id (partitioning extension), left out when
//	                empty
//	schemaversion   schema_version, an integer
//	<column>        each of Message.Fields (postgres.envelope_columns) as
//	                an extension attribute of the column's name, a string;
//	                left out when NULL
//
// The data is the payload: embedded as "data" when it is JSON, base64 in
// "data_base64" otherwise, left out when the payload is empty. In binary
// content mode the message body is the Payload bytes as stored.
const (
	CloudEventsSpecVersion = "1.0"
	contentTypeJSON        = "application/json"
)

// ceFixedSize is about the number of bytes AppendCloudEvent writes besides
// the variable-length fields; it only sizes the buffer.
const ceFixedSize = 220

// AppendCloudEvent appends m as a CloudEvents 1.0 event in structured content
// mode (JSON event format) to dst and returns the extended buffer. Attributes
// appear in the order of the table above, then the data. source is written
// as given. Strings are escaped as AppendJSON escapes them, so the result is
// valid UTF-8 JSON under the same preconditions (see Message).
//
// AppendCloudEvent does not modify m and allocates only when dst lacks room.
func (m *Message) AppendCloudEvent(dst []byte, source string) []byte {
	payload, inline, contentType := m.data()

	size := ceFixedSize + len(m.MessageID) + len(source) + len(m.EventType) + 2*len(m.AggregateID) +
		len(m.Traceparent) + len(contentType) + fieldsSize(m.Fields)
	if inline {
		size += len(payload)
	} else {
		size += base64.StdEncoding.EncodedLen(len(m.Payload))
	}
	dst = slices.Grow(dst, size)

	dst = append(dst, `{"specversion":"1.0","id":`...)
	dst = appendString(dst, m.MessageID)
	dst = append(dst, `,"source":`...)
	dst = appendString(dst, source)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, m.EventType)
	if m.AggregateID != "" {
		dst = append(dst, `,"subject":`...)
		dst = appendString(dst, m.AggregateID)
	}
	dst = append(dst, `,"time":"`...)
	dst = appendTime(dst, m.OccurredAt)
	dst = append(dst, `","datacontenttype":"`...)
	dst = append(dst, contentType...) // a constant, needs no escaping
	dst = append(dst, '"')
	if m.Traceparent != "" {
		dst = append(dst, `,"traceparent":`...)
		dst = appendString(dst, m.Traceparent)
	}
	if m.AggregateID != "" {
		dst = append(dst, `,"partitionkey":`...)
		dst = appendString(dst, m.AggregateID)
	}
	dst = append(dst, `,"schemaversion":`...)
	dst = strconv.AppendInt(dst, int64(m.SchemaVersion), 10)
	dst = appendFields(dst, m.Fields, true)
	switch {
	case !inline:
		dst = append(dst, `,"data_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, m.Payload)
		dst = append(dst, '"')
	case len(payload) > 0:
		dst = append(dst, `,"data":`...)
		dst = append(dst, payload...)
	}
	return append(dst, '}')
}

// CloudEventAttributes returns m's CloudEvents attributes for binary content
// mode, names without a protocol prefix, in the order of AppendCloudEvent:
// a Kafka sink adds "ce_" to each name, an AMQP sink "cloudEvents:". The
// protocol bindings carry datacontenttype in the protocol's own content-type
// (the Kafka header content-type, the AMQP content-type property) instead
// of a prefixed attribute. The body is Payload as stored.
//
// Values are strings as the bindings carry them, in UTF-8 (invalid bytes
// replaced by U+FFFD, as in structured mode): time in RFC 3339,
// schemaversion in decimal. It allocates the slice and the time string, and
// a copy of a value only when that value is not valid UTF-8.
func (m *Message) CloudEventAttributes(source string) []Header {
	_, _, contentType := m.data()
	var tb [len(timeLayout) + 8]byte
	hs := make([]Header, 0, 10)
	hs = append(hs,
		Header{Key: "specversion", Value: CloudEventsSpecVersion},
		Header{Key: "id", Value: validUTF8(m.MessageID)},
		Header{Key: "source", Value: validUTF8(source)},
		Header{Key: "type", Value: validUTF8(m.EventType)},
	)
	if m.AggregateID != "" {
		hs = append(hs, Header{Key: "subject", Value: validUTF8(m.AggregateID)})
	}
	hs = append(hs,
		Header{Key: "time", Value: string(appendTime(tb[:0], m.OccurredAt))},
		Header{Key: "datacontenttype", Value: contentType},
	)
	if m.Traceparent != "" {
		hs = append(hs, Header{Key: "traceparent", Value: validUTF8(m.Traceparent)})
	}
	if m.AggregateID != "" {
		hs = append(hs, Header{Key: "partitionkey", Value: validUTF8(m.AggregateID)})
	}
	hs = append(hs, Header{Key: "schemaversion", Value: strconv.Itoa(m.SchemaVersion)})
	for _, f := range m.Fields {
		if !f.Null {
			hs = append(hs, Header{Key: f.Name, Value: validUTF8(f.Value)})
		}
	}
	return hs
}

// validUTF8 returns s with each byte that is not part of valid UTF-8
// replaced by U+FFFD, as appendString does (strings.ToValidUTF8 would
// replace a run of them by one).
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString("\uFFFD")
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// data decides how the payload travels, by the rule of AppendJSON: JSON
// payloads are embedded (trimmed of JSON whitespace), text and binary ones
// only when they are valid UTF-8 JSON; everything else is base64 with the
// content type of its format.
func (m *Message) data() (payload []byte, inline bool, contentType string) {
	switch m.PayloadFormat {
	case PayloadJSON:
		return trimSpace(m.Payload), true, contentTypeJSON
	case PayloadText:
		if isJSON(m.Payload) {
			return trimSpace(m.Payload), true, contentTypeJSON
		}
		return nil, false, ContentTypeText
	default:
		if isJSON(m.Payload) {
			return trimSpace(m.Payload), true, contentTypeJSON
		}
		return nil, false, ContentTypeBinary
	}
}

// CloudEventData returns the body and content type of m in CloudEvents
// binary content mode: the payload as stored, and application/json when it
// is JSON, else the text or octet-stream type of its format.
func (m *Message) CloudEventData() (body []byte, contentType string) {
	if payload, inline, ct := m.data(); inline {
		return payload, ct
	} else {
		return m.Payload, ct
	}
}
