package sinks

import (
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Header names the relay owns (see envelope.Reserved for the full rule).
const (
	HeaderMessageID     = "message_id"
	HeaderEventType     = "event_type"
	HeaderAggregateID   = "aggregate_id"
	HeaderAggregateType = "aggregate_type"
	HeaderTraceparent   = "traceparent"
	HeaderTracestate    = "tracestate"
	HeaderContentType   = "content-type"
	// HeaderID carries the message id in the debezium format, under the
	// name Debezium's outbox event router gives it.
	HeaderID = envelope.DebeziumIDHeader
)

// Binding is how one broker protocol carries a message's metadata: which
// relay-owned values travel as headers and which as protocol properties,
// and the prefix of CloudEvents attributes in binary content mode. Each
// sink declares its Binding and converts [Binding.Headers] to its wire
// type; it never adds or renames a header of its own accord, so every
// broker carries the same set under the same precedence.
type Binding struct {
	// Properties is true when message_id, event_type and the content type
	// travel as protocol properties (AMQP message-id, type, content-type)
	// rather than as headers.
	Properties bool
	// Aggregate adds the aggregate_id and aggregate_type headers, for
	// protocols without a record key (AMQP, NATS, Redis).
	Aggregate bool
	// CloudEventsPrefix prefixes each CloudEvents attribute name in binary
	// content mode: ce_ (Kafka binding), cloudEvents: (AMQP binding), ce-
	// (NATS and HTTP bindings), ce_ (Redis, which has no binding: Kafka's is the
	// closest, a flat list of fields).
	CloudEventsPrefix string
}

// The bindings of the sinks in this repository.
var (
	Kafka = Binding{CloudEventsPrefix: "ce_"}
	AMQP  = Binding{Properties: true, Aggregate: true, CloudEventsPrefix: "cloudEvents:"}
	NATS  = Binding{Aggregate: true, CloudEventsPrefix: "ce-"}
	Redis = Binding{Aggregate: true, CloudEventsPrefix: "ce_"}
	// HTTP is the webhook sink's: headers as the CloudEvents HTTP binding
	// names its attributes (ce-).
	HTTP = Binding{Aggregate: true, CloudEventsPrefix: "ce-"}
	// PubSub is the pubsub sink's: attributes, with the prefix of the
	// CloudEvents Google Pub/Sub binding (ce-). The aggregate_id is the
	// ordering key too, which subscribers see.
	PubSub = Binding{Aggregate: true, CloudEventsPrefix: "ce-"}
)

// ContentType is the media type of m's body: m.ContentType, or
// application/json when it is empty.
func ContentType(m *relay.Message) string {
	if m.ContentType == "" {
		return "application/json"
	}
	return m.ContentType
}

// Headers appends m's headers to dst, in this order and precedence, and
// returns the extended slice and how many of its new entries are
// relay-owned:
//
//  0. in the debezium format, id: the message id, as Debezium's outbox
//     event router sends it (on every binding, AMQP too);
//  1. message_id, event_type (unless Properties);
//  2. aggregate_id, aggregate_type (when Aggregate);
//  3. traceparent, tracestate (each when set);
//  4. content-type (unless Properties): the body's media type, which in
//     CloudEvents binary mode is the event's datacontenttype;
//  5. in CloudEvents binary mode, every attribute of m.Attributes with the
//     binding's prefix, except datacontenttype, which every binding carries
//     in the protocol's content type instead (item 4, or the AMQP
//     content-type property);
//  6. the row's headers, in row order, without any whose name is reserved
//     (envelope.Reserved): a row can add headers but never repeat or
//     override one the relay owns. The relay drops and logs those when it
//     builds the message; dropping them here again keeps the rule for
//     programs that hand a sink messages of their own.
//
// Every name appears at most once. Headers does not modify m.
func (b Binding) Headers(dst []envelope.Header, m *relay.Message) ([]envelope.Header, int) {
	start := len(dst)
	if m.Format == relay.FormatDebezium {
		dst = append(dst, envelope.Header{Key: HeaderID, Value: m.ID})
	}
	if !b.Properties {
		dst = append(dst,
			envelope.Header{Key: HeaderMessageID, Value: m.ID},
			envelope.Header{Key: HeaderEventType, Value: m.EventType})
	}
	if b.Aggregate {
		dst = append(dst,
			envelope.Header{Key: HeaderAggregateID, Value: m.AggregateID},
			envelope.Header{Key: HeaderAggregateType, Value: m.AggregateType})
	}
	if m.Traceparent != "" {
		dst = append(dst, envelope.Header{Key: HeaderTraceparent, Value: m.Traceparent})
	}
	if m.Tracestate != "" {
		dst = append(dst, envelope.Header{Key: HeaderTracestate, Value: m.Tracestate})
	}
	if !b.Properties {
		dst = append(dst, envelope.Header{Key: HeaderContentType, Value: ContentType(m)})
	}
	for _, a := range m.Attributes {
		if a.Key == "datacontenttype" {
			continue
		}
		dst = append(dst, envelope.Header{Key: b.CloudEventsPrefix + a.Key, Value: a.Value})
	}
	own := len(dst) - start
	for _, h := range m.Headers {
		if !envelope.Reserved(h.Key) {
			dst = append(dst, h)
		}
	}
	return dst, own
}
