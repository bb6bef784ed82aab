package envelope

import "strings"

// reservedNames are the header names the relay sets itself on some broker.
var reservedNames = []string{
	"id", "message_id", "event_type", "aggregate_id", "aggregate_type",
	"traceparent", "tracestate", "content-type", "content_type",
}

// reservedPrefixes start the names of CloudEvents attributes in binary
// content mode under each protocol binding (Kafka and Redis ce_, NATS and
// HTTP ce-, AMQP cloudEvents: and its JMS-safe form cloudEvents_).
var reservedPrefixes = []string{"ce_", "ce-", "cloudevents:", "cloudevents_", "x-outboxrelay-"}

// Reserved reports whether a row header named name would repeat or
// override a header the relay owns: id (the debezium format's event id),
// message_id, event_type, aggregate_id, aggregate_type, traceparent,
// tracestate, content-type (or content_type), or a name starting with ce_,
// ce-, cloudEvents:, cloudEvents_ or x-outboxrelay- (headers a sink sets
// for itself, such as RabbitMQ's x-outboxrelay-publish-tag). Names
// compare case-insensitively, as HTTP-style headers do, so Content-Type is
// reserved too. A reserved name is reserved on every broker and in every
// format, whether or not that broker carries the header, so that one rule
// holds for all consumers.
func Reserved(name string) bool {
	return ReservedAs(name) != ""
}

// ReservedAs returns the reserved name or prefix that makes name reserved
// (see Reserved), in lower case, a prefix followed by "*": "content-type"
// for Content-Type, "ce_*" for ce_id. It returns "" when name is not
// reserved. The result is one of ReservedForms, a small fixed set, so it
// can label a metric whatever names rows use.
func ReservedAs(name string) string {
	for _, r := range reservedNames {
		if strings.EqualFold(name, r) {
			return r
		}
	}
	for _, p := range reservedPrefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			return p + "*"
		}
	}
	return ""
}

// ReservedForms returns every value ReservedAs can return, in a new slice.
func ReservedForms() []string {
	out := append([]string(nil), reservedNames...)
	for _, p := range reservedPrefixes {
		out = append(out, p+"*")
	}
	return out
}

// WithoutReserved returns hs without its reserved headers (see Reserved),
// and the names it left out. It reuses hs's array when it drops nothing
// and allocates only when it drops something.
func WithoutReserved(hs []Header) (kept []Header, dropped []string) {
	for i, h := range hs {
		if !Reserved(h.Key) {
			continue
		}
		kept = append(make([]Header, 0, len(hs)-1), hs[:i]...)
		dropped = append(dropped, h.Key)
		for _, h := range hs[i+1:] {
			if Reserved(h.Key) {
				dropped = append(dropped, h.Key)
			} else {
				kept = append(kept, h)
			}
		}
		return kept, dropped
	}
	return hs, nil
}
