package nats

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/envelope"
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
		URL: "http://u:s3cret@h:1", Subject: "a.{nope}", Stream: "a.b", MaxInFlight: -1, AckTimeout: -1,
	}.Validate()
	if err == nil {
		t.Fatal("invalid Config validated")
	}
	for _, want := range []string{"sink.nats.url", "sink.nats.subject", "sink.nats.stream", "sink.nats.max_inflight", "sink.nats.ack_timeout"} {
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

// TestSubjectContained: a row cannot publish to the server's own subjects
// ($JS.API manages streams, $JS.ACK acknowledges consumers), to _INBOX
// (where the sink's PubAcks arrive), to a name of the relay's own, or to a
// subject that is not valid UTF-8; a template that can only render such a
// subject fails at start-up.
func TestSubjectContained(t *testing.T) {
	tmpl, err := parseTemplate("{aggregate_type}.{event_type}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ aggType, want string }{
		{"$JS", "reserved for the NATS server"},
		{"$SYS", "reserved for the NATS server"},
		{"$KV", "reserved for the NATS server"},
		{"_INBOX", "reserved for replies to requests"},
		{"__outboxrelay_positions", "reserved for the relay's own use"},
		{"caf\xe9", `"caf\xe9.x" is not valid UTF-8 (byte 0xE9 at offset 3)`},
	} {
		got, err := tmpl.render(&relay.Message{ID: "1", AggregateType: c.aggType, EventType: "x"})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("aggregate_type %q rendered %q, %v; want an error containing %q", c.aggType, got, err, c.want)
		}
	}
	if got, err := tmpl.render(&relay.Message{ID: "1", AggregateType: "a$JS", EventType: "_INBOX"}); err != nil {
		t.Errorf("an ordinary subject %q was refused: %v", got, err)
	}
	for _, s := range []string{"$JS.API.{aggregate_type}", "_INBOX.{aggregate_type}", "__outboxrelay_{aggregate_type}"} {
		if _, err := parseTemplate(s); err == nil || !strings.Contains(err.Error(), "no row may address it") {
			t.Errorf("parseTemplate(%q) = %v, want it refused", s, err)
		}
	}
}

// TestHeaderErrorNamesHeader: a header NATS cannot carry fails with an
// error that names the header and the rule, where nats.go only says
// "could not decode headers"; a value that is not valid UTF-8 fails too.
func TestHeaderErrorNamesHeader(t *testing.T) {
	s := &Sink{cfg: Config{Stream: "S"}}
	for _, c := range []struct {
		h    envelope.Header
		want string
	}{
		{envelope.Header{Key: "bad key", Value: "x"}, `header name "bad key" cannot be sent over NATS, whose header names are printable ASCII without spaces or any of "()/,:;<=>?@[\]{}; rename the row header`},
		{envelope.Header{Key: "a:b", Value: "x"}, `header name "a:b" cannot be sent over NATS`},
		{envelope.Header{Key: "zoë", Value: "x"}, `header name "zoë" cannot be sent over NATS`},
		{envelope.Header{Key: "tenant", Value: "caf\xe9"}, `header "tenant" value "caf\xe9" is not valid UTF-8`},
	} {
		m := &relay.Message{ID: "1", AggregateType: "order", AggregateID: "1", EventType: "x", Headers: []envelope.Header{c.h}}
		_, err := s.header(m)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("header %q: %v, want an error containing %s", c.h.Key, err, c.want)
		}
	}
	m := &relay.Message{ID: "1", AggregateType: "ord\xe9r", AggregateID: "1", EventType: "x"}
	if _, err := s.header(m); err == nil || !strings.Contains(err.Error(), `header "aggregate_type" value`) {
		t.Errorf("aggregate_type that is not UTF-8: %v, want an error naming the aggregate_type header", err)
	}
	m = &relay.Message{ID: "1", AggregateType: "order", AggregateID: "1", EventType: "x", Headers: []envelope.Header{{Key: "tenant-id_2", Value: "zoë"}}}
	if h, err := s.header(m); err != nil || h.Get("tenant-id_2") != "zoë" {
		t.Errorf("an ordinary header: %v, %v", h, err)
	}
}
