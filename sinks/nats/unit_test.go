package nats

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
)

func TestRender(t *testing.T) {
	tmpl, err := parseTemplate(DefaultSubject)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		aggType, eventType, want string
	}{
		{"order", "order.created", "outbox.order.order%2Ecreated"},
		{"a*b", "x>y", "outbox.a%2Ab.x%3Ey"},
		{"100%", "with space\ttab\r\n", "outbox.100%25.with%20space%09tab%0D%0A"},
		{"zoë", "日本", "outbox.zoë.日本"},
		{"del\x7f", "nul\x00", "outbox.del%7F.nul%00"},
		{">", "*", "outbox.%3E.%2A"},
	} {
		got, err := tmpl.render(&relay.Message{ID: "1", AggregateType: c.aggType, EventType: c.eventType})
		if err != nil || got != c.want {
			t.Errorf("render(%q, %q) = %q, %v; want %q", c.aggType, c.eventType, got, err, c.want)
		}
	}
	for _, m := range []*relay.Message{
		{ID: "1", AggregateType: "", EventType: "e"},
		{ID: "1", AggregateType: "a", EventType: strings.Repeat("x", maxSubjectLen)},
	} {
		if got, err := tmpl.render(m); err == nil {
			t.Errorf("render(%q, %.10q) = %q, want an error", m.AggregateType, m.EventType, got)
		}
	}
	// {table} of a table-less message is empty: a permanent failure, not a
	// subject with an empty token.
	tt, _ := parseTemplate("outbox.{table}")
	if _, err := tt.render(&relay.Message{ID: "1"}); err == nil {
		t.Error("empty {table} rendered")
	}
	if got, _ := tt.render(&relay.Message{ID: "1", Table: "public.outbox"}); got != "outbox.public%2Eoutbox" {
		t.Errorf("table rendered as %q", got)
	}
}

func TestParseTemplateErrors(t *testing.T) {
	for _, s := range []string{
		"", "outbox.{aggregatetype}", "outbox.{aggregate_type", "outbox.}", "outbox.*.{event_type}",
		"outbox.>", "out box.{event_type}", "outbox..{event_type}", ".{event_type}", "{event_type}.",
	} {
		if _, err := parseTemplate(s); err == nil {
			t.Errorf("parseTemplate(%q) succeeded", s)
		}
	}
	for _, s := range []string{"outbox", "outbox.{aggregate_type}", "{aggregate_type}", "x-{aggregate_type}_y.{table}"} {
		if _, err := parseTemplate(s); err != nil {
			t.Errorf("parseTemplate(%q): %v", s, err)
		}
	}
}

func TestStreamSubjects(t *testing.T) {
	for tmpl, want := range map[string]string{
		"outbox.{aggregate_type}.{event_type}":     "[outbox.>]",
		"a.b.{event_type}":                         "[a.b.>]",
		"events":                                   "[events]",
		"{aggregate_type}.events":                  "[*.events]",
		"{aggregate_type}":                         "[*]",
		"outbox.x{aggregate_type}.{event_type}":    "[outbox.>]",
		"orders-{aggregate_type}.created.{table}.": "",
	} {
		tt, err := parseTemplate(tmpl)
		if want == "" {
			if err == nil {
				t.Errorf("parseTemplate(%q) succeeded", tmpl)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(tt.streamSubjects()); got != want {
			t.Errorf("streamSubjects(%q) = %s, want %s", tmpl, got, want)
		}
		for _, f := range tt.streamSubjects() {
			if !subjectMatches(f, tt.shape()) {
				t.Errorf("stream subject %q does not capture %q", f, tt.shape())
			}
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		filter, subj string
		want         bool
	}{
		{"outbox.>", "outbox.*.*", true},
		{"outbox.>", "outbox", false},
		{"outbox.*.*", "outbox.*.*", true},
		{"outbox.*", "outbox.*.*", false},
		{"outbox.order.*", "outbox.*.*", false},
		{">", "a.b", true},
		{"a.b", "a.b", true},
	} {
		if got := subjectMatches(c.filter, c.subj); got != c.want {
			t.Errorf("subjectMatches(%q, %q) = %v", c.filter, c.subj, got)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	err := Config{
		URL: "http://u:s3cret@h:1", Subject: "a.{nope}", Stream: "a.b", MaxPending: -1, AckTimeout: -1,
	}.Validate()
	if err == nil {
		t.Fatal("invalid Config validated")
	}
	for _, want := range []string{"sink.nats.url", "sink.nats.subject", "sink.nats.stream", "sink.nats.max_pending", "sink.nats.ack_timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error shows the password: %v", err)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://u:pw@h:4222":               "nats://u:xxxxx@h:4222",
		"nats://token@h:4222":              "nats://xxxxx@h:4222",
		"nats://h:4222,nats://u:pw@g:4222": "nats://h:4222,nats://u:xxxxx@g:4222",
		"nats://127.0.0.1:4222":            "nats://127.0.0.1:4222",
	} {
		if got := redact.URL(in); got != want {
			t.Errorf("redact.URL(%q) = %q, want %q", in, got, want)
		}
	}
	err := redact.Error(errors.New("auth failed for u:pw"), "nats://u:pw@h")
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("redact.Error kept the password: %v", err)
	}
}

func TestPermanent(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{Code: 400, ErrorCode: 10054}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10060}, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10023}, false},
		{&jetstream.APIError{Code: 500, ErrorCode: 10077}, false},
		{natsgo.ErrMaxPayload, true},
		{natsgo.ErrBadHeaderMsg, true},
		{natsgo.ErrDisconnected, false},
		{natsgo.ErrReconnectBufExceeded, false},
		{jetstream.ErrNoStreamResponse, false},
		{jetstream.ErrAsyncPublishTimeout, false},
		{jetstream.ErrTooManyStalledMsgs, false},
	} {
		if got := permanent(fmt.Errorf("wrapped: %w", c.err)); got != c.want {
			t.Errorf("permanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
