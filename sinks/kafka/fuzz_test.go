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
		tmpl, err := parseTemplate(tmplText, DefaultPositionsTopic)
		if err != nil {
			return
		}
		m := &relay.Message{AggregateType: aggType, EventType: eventType, Table: table}
		r := newTopics(tmpl, DefaultPositionsTopic).render(m)
		want := strings.NewReplacer("{aggregate_type}", aggType, "{event_type}", eventType, "{table}", table).Replace(tmplText)
		if r.topic != want {
			t.Fatalf("topic %q, want %q", r.topic, want)
		}
		if (r.err == nil) != (checkTopic(r.topic, DefaultPositionsTopic) == nil) {
			t.Fatalf("topic %q accepted %v, but checkTopic says %v", r.topic, r.err == nil, checkTopic(r.topic, DefaultPositionsTopic))
		}
		if first, _, _ := strings.Cut(tmplText, "{"); !strings.HasPrefix(r.topic, first) {
			t.Fatalf("topic %q does not start with the template's %q", r.topic, first)
		}
	})
}
