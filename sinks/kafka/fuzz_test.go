package kafka

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
)

// FuzzTopic: a topic is the template with the values put in verbatim, and
// is either a legal Kafka topic name or refused (the message is then
// dead-lettered). Values are never rewritten into some other topic, and
// the template's literal text always frames the result.
func FuzzTopic(f *testing.F) {
	f.Add("outbox.{aggregate_type}", "order", "order.created", "public.outbox")
	f.Add("{table}.{event_type}", "a/b", "..", "")
	f.Add("x-{aggregate_type}-y", strings.Repeat("z", 250), "", "p.o")
	f.Add("{aggregate_type}", ".", "", "")
	f.Fuzz(func(t *testing.T, tmplText, aggType, eventType, table string) {
		tmpl, err := parseTemplate(tmplText)
		if err != nil {
			return
		}
		m := &relay.Message{AggregateType: aggType, EventType: eventType, Table: table}
		r := newTopics(tmplText, tmpl).render(m)
		var want strings.Builder
		for _, s := range tmpl.segs {
			switch s.field {
			case fieldNone:
				want.WriteString(s.lit)
			case fieldAggregateType:
				want.WriteString(aggType)
			case fieldEventType:
				want.WriteString(eventType)
			case fieldTable:
				want.WriteString(table)
			}
		}
		if r.topic != want.String() {
			t.Fatalf("topic %q, want %q", r.topic, want.String())
		}
		if (r.err == nil) != (checkTopic(r.topic) == nil) {
			t.Fatalf("topic %q accepted %v, but checkTopic says %v", r.topic, r.err == nil, checkTopic(r.topic))
		}
		if first := tmpl.segs[0]; first.field == fieldNone && !strings.HasPrefix(r.topic, first.lit) {
			t.Fatalf("topic %q does not start with the template's %q", r.topic, first.lit)
		}
	})
}
