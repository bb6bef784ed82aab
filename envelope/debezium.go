package envelope

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
// array; Debezium allocates nothing.
func (m *Message) Debezium() Debezium {
	value, ct := m.CloudEventData()
	return Debezium{Key: m.AggregateID, ID: m.MessageID, Value: value, ContentType: ct}
}
