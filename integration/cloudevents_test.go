package integration

import (
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
)

// TestCloudEventsStructuredAndBinary: envelope.format cloudevents publishes
// CloudEvents 1.0 that the official SDK decodes; cloudevents-binary puts the
// attributes in ce_ headers and the bare payload in the value.
func TestCloudEventsStructuredAndBinary(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, mode := range []string{"cloudevents", "cloudevents-binary"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			c := e.consume("outbox.order")
			p := e.start("OUTBOXRELAY_ENVELOPE_FORMAT="+mode, "OUTBOXRELAY_ENVELOPE_SOURCE=/shop/orders")
			p.waitLog(`"streaming"`, 30*time.Second)
			var id string
			if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, traceparent)
				VALUES ('order', '42', 'order.created', '{"order_id": 42}', $1) RETURNING id::text`, tp).Scan(&id); err != nil {
				t.Fatal(err)
			}
			r := c.waitIDs([]string{id}, 30*time.Second)[0]
			if mode == "cloudevents" {
				var ev cloudevents.Event
				if err := ev.UnmarshalJSON(r.Value); err != nil {
					t.Fatalf("SDK cannot decode %s: %v", r.Value, err)
				}
				if err := ev.Validate(); err != nil {
					t.Fatal(err)
				}
				if ev.ID() != id || ev.Source() != "/shop/orders" || ev.Type() != "order.created" || ev.Subject() != "42" ||
					string(ev.Data()) != `{"order_id": 42}` || ev.Extensions()["traceparent"] != tp || r.Headers["content-type"] != "application/cloudevents+json" {
					t.Fatalf("event %v; content-type %q", ev, r.Headers["content-type"])
				}
				return
			}
			for k, v := range map[string]string{"ce_id": id, "ce_source": "/shop/orders", "ce_type": "order.created",
				"ce_subject": "42", "ce_specversion": "1.0", "ce_traceparent": tp, "content-type": "application/json"} {
				if r.Headers[k] != v {
					t.Errorf("header %s = %q, want %q", k, r.Headers[k], v)
				}
			}
			if string(r.Value) != `{"order_id": 42}` {
				t.Errorf("binary mode value = %s, want the bare payload", r.Value)
			}
			p.stop()
		})
	}
}
