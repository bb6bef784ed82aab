package sinks

import (
	"fmt"
	"testing"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// TestDebeziumIDHeader: in the debezium format every binding sends the id
// header first and once, holding the message id, even when the message
// carries a row header named id; the other formats send none.
func TestDebeziumIDHeader(t *testing.T) {
	for _, b := range []Binding{Kafka, AMQP, NATS, Redis} {
		for _, f := range []relay.Format{relay.FormatEnvelope, relay.FormatDebezium} {
			m := &relay.Message{ID: "m1", AggregateID: "42", AggregateType: "order", EventType: "x", Format: f,
				Headers: []envelope.Header{{Key: "ID", Value: "SPOOFED"}, {Key: "tenant", Value: "acme"}}}
			hs, own := b.Headers(nil, m)
			var ids []string
			for _, h := range hs {
				if h.Key == "id" || h.Key == "ID" {
					ids = append(ids, h.Value)
				}
			}
			want := "[]"
			if f == relay.FormatDebezium {
				want = "[m1]"
				if hs[0] != (envelope.Header{Key: "id", Value: "m1"}) || own < 1 {
					t.Errorf("%+v %s: headers %v, want id first", b, f, hs)
				}
			}
			if fmt.Sprint(ids) != want || hs[len(hs)-1].Key != "tenant" {
				t.Errorf("%+v %s: headers %v, want id values %s and the tenant header", b, f, hs, want)
			}
		}
	}
}
