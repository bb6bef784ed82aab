package route

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/relay"
)

var msg = &relay.Message{AggregateType: "order", EventType: "order.created", Table: "public.outbox"}

func TestParse(t *testing.T) {
	for _, tc := range []struct{ tmpl, want string }{
		{"", ""},
		{"all-events", "all-events"},
		{"outbox.{aggregate_type}", "outbox.order"},
		{"{table}.{event_type}", "public.outbox.order.created"},
		{"{aggregate_type}-{aggregate_type}_x", "order-order_x"},
	} {
		tmpl, err := Parse(tc.tmpl)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.tmpl, err)
		}
		if got := tmpl.Render(msg, nil); got != tc.want {
			t.Errorf("%q rendered %q, want %q", tc.tmpl, got, tc.want)
		}
		if got := string(tmpl.Append([]byte("x:"), msg, nil)); got != "x:"+tc.want {
			t.Errorf("%q appended %q, want %q", tc.tmpl, got, "x:"+tc.want)
		}
		c, ok := tmpl.Constant()
		if constant := !strings.Contains(tc.tmpl, "{"); ok != constant || ok && c != tc.tmpl {
			t.Errorf("%q: Constant() = %q, %v", tc.tmpl, c, ok)
		}
		if tmpl.String() != tc.tmpl {
			t.Errorf("String() = %q, want %q", tmpl.String(), tc.tmpl)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		tmpl  string
		brace byte
		name  string
		want  string
	}{
		{"outbox}", '}', "", `template "outbox}" has a '}' without '{'; placeholders are {aggregate_type}, {event_type} and {table}`},
		{"{event_type", '{', "", `template "{event_type" has an unclosed '{'; placeholders are {aggregate_type}, {event_type} and {table}`},
		{"{a{table}", '{', "", "unclosed '{'"},
		{"{table}}", '}', "", "without '{'"},
		{"{aggregate}.{event_type}", 0, "aggregate", `template "{aggregate}.{event_type}" has unknown placeholder {aggregate}; use {aggregate_type}, {event_type} or {table}`},
		{"x.{}", 0, "", "unknown placeholder {}"},
	} {
		_, err := Parse(tc.tmpl)
		var serr *SyntaxError
		if !errors.As(err, &serr) {
			t.Fatalf("Parse(%q) = %v, want a *SyntaxError", tc.tmpl, err)
		}
		if serr.Template != tc.tmpl || serr.Brace != tc.brace || serr.Name != tc.name {
			t.Errorf("Parse(%q) = %+v", tc.tmpl, *serr)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %q, want %q", tc.tmpl, err, tc.want)
		}
	}
}

func TestEscape(t *testing.T) {
	esc := EscapeFunc(func(c byte) bool { return c == '.' || c == '%' || c < ' ' || c >= 0x80 })
	for _, tc := range []struct{ v, want string }{
		{"", ""},
		{"order", "order"},
		{"order.created", "order%2Ecreated"},
		{"..%", "%2E%2E%25"},
		{"a\x00b\x1f", "a%00b%1F"},
		{"ä", "%C3%A4"},
	} {
		if got := string(esc.Append([]byte("x:"), tc.v)); got != "x:"+tc.want {
			t.Errorf("Append(%q) = %q, want %q", tc.v, got, "x:"+tc.want)
		}
	}
	var none *Escape
	if got := string(none.Append(nil, "a.b%")); got != "a.b%" {
		t.Errorf("nil Escape: %q", got)
	}
	tmpl, _ := Parse("{table}.{event_type}")
	if got := tmpl.Render(msg, esc); got != "public%2Eoutbox.order%2Ecreated" {
		t.Errorf("Render = %q", got)
	}
}

// FuzzRender: a template renders to its text with each placeholder replaced
// by its value, escaped so that no byte of the set is left and the value
// can be recovered by percent-decoding.
func FuzzRender(f *testing.F) {
	f.Add("outbox.{aggregate_type}.{event_type}", "order", "order.created", "public.outbox")
	f.Add("{table}", "", "%2E", "a.b%c")
	f.Fuzz(func(t *testing.T, tmplText, aggType, eventType, table string) {
		tmpl, err := Parse(tmplText)
		if err != nil {
			return
		}
		m := &relay.Message{AggregateType: aggType, EventType: eventType, Table: table}
		want := strings.NewReplacer("{aggregate_type}", aggType, "{event_type}", eventType, "{table}", table).Replace(tmplText)
		if got := tmpl.Render(m, nil); got != want {
			t.Fatalf("%q rendered %q, want %q", tmplText, got, want)
		}
		esc := EscapeFunc(func(c byte) bool { return c == '.' || c == '%' || c == '+' })
		for _, v := range []string{aggType, eventType, table} {
			e := string(esc.Append(nil, v))
			if strings.ContainsAny(e, ".+") {
				t.Fatalf("%q escaped to %q", v, e)
			}
			if d, err := url.PathUnescape(e); err != nil || d != v {
				t.Fatalf("%q escaped to %q, which decodes to %q, %v", v, e, d, err)
			}
		}
	})
}

var rendered string

func BenchmarkRender(b *testing.B) {
	esc := EscapeFunc(func(c byte) bool { return c == '.' || c == '%' })
	tmpl, _ := Parse("outbox.{aggregate_type}.{event_type}")
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf [128]byte
		for range b.N {
			tmpl.Append(buf[:0], msg, esc)
		}
	})
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			rendered = tmpl.Render(msg, esc)
		}
	})
}
