package envelope

import (
	"encoding/base64"
	"unicode/utf8"
)

// The debezium format reproduces what Debezium's outbox event router
// (io.debezium.transforms.outbox.EventRouter) emits with its default
// settings and table.expand.json.payload=true, so that consumers written
// for it read the relay's messages unchanged. The source of truth is the
// router's documentation (documentation/modules/ROOT/pages/transformations/
// outbox-event-router.adoc in the Debezium repository):
//
//	record key   the aggregate id (table.field.event.key = aggregateid)
//	record value the payload (table.field.event.payload = payload); with
//	             expand-JSON, a JSON payload is the JSON document itself,
//	             not a JSON string holding it
//	header id    the event id (table.field.event.id = id)
//	topic        outbox.event.<aggregatetype> (route.topic.replacement);
//	             the relay's topic template decides, see docs/debezium.md
//
// The router adds no other header and no envelope by default: the event
// type travels only when table.fields.additional.placement asks for it.

// DebeziumIDHeader is the name of the header that carries the event id in
// the debezium format, as Debezium's outbox event router names it.
const DebeziumIDHeader = "id"

// Debezium is a message in the debezium format.
type Debezium struct {
	// Key is the record key: the aggregate id.
	Key string
	// ID is the value of the id header: the message id.
	ID string
	// Value is the message body: the payload as stored, which is the JSON
	// document itself when the payload is JSON (expand-JSON), else the
	// payload's bytes.
	Value []byte
	// ContentType is application/json for a JSON payload, else the text or
	// octet-stream type of the payload's format.
	ContentType string
}

// Debezium returns m in the debezium format. Value shares m.Payload's
// array; Debezium allocates nothing, unless m has Fields: then, as the
// router does with table.fields.additional.placement envelope, the value
// is a JSON object with the payload as "payload" (the JSON document, or a
// string: the text, or the bytes in base64) and each field that is not
// NULL next to it.
func (m *Message) Debezium() Debezium {
	value, ct := m.CloudEventData()
	if len(m.Fields) == 0 || m.Payload == nil {
		return Debezium{Key: m.AggregateID, ID: m.MessageID, Value: value, ContentType: ct}
	}
	payload, inline, _ := m.data()
	dst := make([]byte, 0, len(m.Payload)*4/3+fieldsSize(m.Fields)+16)
	dst = append(dst, `{"payload":`...)
	switch {
	case inline:
		dst = append(dst, payload...)
	case m.PayloadFormat == PayloadText && utf8.Valid(m.Payload):
		dst = appendString(dst, string(m.Payload))
	default:
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, m.Payload)
		dst = append(dst, '"')
	}
	dst = appendFields(dst, m.Fields, true)
	return Debezium{Key: m.AggregateID, ID: m.MessageID, Value: append(dst, '}'), ContentType: contentTypeJSON}
}
