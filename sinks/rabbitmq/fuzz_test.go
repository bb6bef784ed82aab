package rabbitmq

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
)

// FuzzRoutingKey: whatever the values, the routing key has the words of
// the template, its literal words unchanged, and no wildcard the template
// does not have, so a value can never route a message to a binding the
// template does not match.
func FuzzRoutingKey(f *testing.F) {
	f.Add("{aggregate_type}.{event_type}", "order", "order.created", "public.outbox")
	f.Add("outbox.{table}.#", "a.b", "*", "%2E")
	f.Add("{aggregate_type}", "#", "", "")
	f.Add("x.{event_type}y.z", "", "a%b.c*d#e", "")
	f.Fuzz(func(t *testing.T, tmplText, aggType, eventType, table string) {
		tmpl, err := parseTemplate(tmplText)
		if err != nil {
			return
		}
		key := tmpl.render(&relay.Message{AggregateType: aggType, EventType: eventType, Table: table})
		shape := tmpl.render(&relay.Message{AggregateType: "x", EventType: "x", Table: "x"})
		words, shapeWords := strings.Split(key, "."), strings.Split(shape, ".")
		if len(words) != len(shapeWords) {
			t.Fatalf("key %q has %d words, the template %q has %d", key, len(words), tmplText, len(shapeWords))
		}
		for _, wc := range []string{"*", "#"} {
			if strings.Count(key, wc) != strings.Count(shape, wc) {
				t.Fatalf("key %q has a %s the template %q does not", key, wc, tmplText)
			}
		}
		// Words made of literal text alone are unchanged.
		lit := tmpl.render(&relay.Message{AggregateType: "\x00", EventType: "\x00", Table: "\x00"})
		for i, w := range strings.Split(lit, ".") {
			if !strings.Contains(w, "\x00") && words[i] != w {
				t.Fatalf("key %q changed the template's word %q", key, w)
			}
		}
	})
}
