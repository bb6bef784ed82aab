package nats

import (
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
)

// FuzzSubject: a rendered subject is a valid publish subject with the
// template's tokens, and is captured by the stream the sink would create
// for the template; otherwise it is refused. A value can never add a
// token, a wildcard or whitespace.
func FuzzSubject(f *testing.F) {
	f.Add("outbox.{aggregate_type}.{event_type}", "order", "order.created", "public.outbox")
	f.Add("{aggregate_type}", ">", "*", "")
	f.Add("x.{table}", "", "", "a b\tc.d")
	f.Add("a.b{event_type}c", "", "%2E>", "")
	f.Fuzz(func(t *testing.T, tmplText, aggType, eventType, table string) {
		tmpl, err := parseTemplate(tmplText)
		if err != nil {
			return
		}
		subject, err := tmpl.render(&relay.Message{ID: "1", AggregateType: aggType, EventType: eventType, Table: table})
		if err != nil {
			return
		}
		if checkSubject(subject) != nil {
			t.Fatalf("rendered an invalid subject %q", subject)
		}
		if got, want := strings.Count(subject, "."), strings.Count(tmpl.shape(), "."); got != want {
			t.Fatalf("subject %q has %d dots, the template %q %d", subject, got, tmplText, want)
		}
		matched := false
		for _, filter := range tmpl.streamSubjects() {
			matched = matched || subjectMatches(filter, subject)
		}
		if !matched {
			t.Fatalf("subject %q escapes the stream subjects %v of template %q", subject, tmpl.streamSubjects(), tmplText)
		}
	})
}
