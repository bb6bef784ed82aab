package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
)

func TestTemplateRender(t *testing.T) {
	m := &relay.Message{AggregateType: "order", EventType: "order.created", Table: "public.outbox"}
	for _, tc := range []struct{ tmpl, want string }{
		{"{aggregate_type}.{event_type}", "order.order%2Ecreated"},
		{"outbox.{table}", "outbox.public%2Eoutbox"},
		{"static.key", "static.key"},
		{"{aggregate_type}", "order"},
		{"a-{aggregate_type}-b.{event_type}", "a-order-b.order%2Ecreated"},
	} {
		tp, err := parseTemplate(tc.tmpl)
		if err != nil {
			t.Fatalf("parseTemplate(%q): %v", tc.tmpl, err)
		}
		if got := tp.render(m); got != tc.want {
			t.Errorf("render(%q) = %q, want %q", tc.tmpl, got, tc.want)
		}
	}
}

// TestDestinationsCache checks that a remembered key gives the same key and
// destination as rendering anew, for keys seen before, new keys, a routed
// message's own template, and keys past the cache's bound, and that a key
// found in the cache allocates nothing.
func TestDestinationsCache(t *testing.T) {
	tp, err := parseTemplate("{aggregate_type}.{event_type}")
	if err != nil {
		t.Fatal(err)
	}
	d := destinations{exchange: "ex"}
	check := func(m *relay.Message) {
		t.Helper()
		want := tp.render(m)
		key, dest := d.render(tp, m)
		if key != want || dest != "ex/"+want {
			t.Fatalf("render(%+v) = %q, %q; want %q, %q", m, key, dest, want, "ex/"+want)
		}
	}
	for round := 0; round < 2; round++ {
		for i := 0; i < maxCachedKeys+50; i++ {
			check(&relay.Message{AggregateType: fmt.Sprintf("t%d", i), EventType: "a.b"})
		}
		check(&relay.Message{AggregateType: "t1", EventType: "a.b", RouteDestination: "routed.{event_type}"})
	}
	if n := len(*d.seen.Load()); n != maxCachedKeys {
		t.Errorf("the cache holds %d keys, want its bound %d", n, maxCachedKeys)
	}
	m := &relay.Message{AggregateType: "t1", EventType: "a.b"}
	if n := testing.AllocsPerRun(100, func() { d.render(tp, m) }); n != 0 {
		t.Errorf("a remembered key allocates %.0f times, want 0", n)
	}
}

func TestTemplateEscaping(t *testing.T) {
	tp, err := parseTemplate("{aggregate_type}.{event_type}")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ agg, ev, want string }{
		{"a.b", "c", "a%2Eb.c"},
		{"#", "*", "%23.%2A"},
		{"100%", "x", "100%25.x"},
		{"%2E", "x", "%252E.x"}, // an already escaped value stays distinct from '.'
		{"plain", "ünïcode", "plain.ünïcode"},
		{"", "x", ".x"},
	} {
		got := tp.render(&relay.Message{AggregateType: tc.agg, EventType: tc.ev})
		if got != tc.want {
			t.Errorf("render(%q, %q) = %q, want %q", tc.agg, tc.ev, got, tc.want)
		}
		// Whatever the values, the key has exactly the template's two words.
		if n := strings.Count(got, "."); n != 1 {
			t.Errorf("render(%q, %q) = %q has %d dots, want 1", tc.agg, tc.ev, got, n)
		}
		if strings.ContainsAny(got, "*#") {
			t.Errorf("render(%q, %q) = %q contains a wildcard", tc.agg, tc.ev, got)
		}
	}
}

func TestTemplateErrors(t *testing.T) {
	for _, tmpl := range []string{
		"{aggregate}", "{aggregate_type", "aggregate_type}", "{}", "{{event_type}}", "{event_type}.{tabel}",
	} {
		if _, err := parseTemplate(tmpl); err == nil {
			t.Errorf("parseTemplate(%q) succeeded, want error", tmpl)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Config{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(minimal) = %v", err)
	}
	for name, tc := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"no url":            {func(c *Config) { c.URL = "" }, "url is empty"},
		"bad scheme":        {func(c *Config) { c.URL = "http://guest:s3cret@host/" }, "invalid"},
		"unknown field":     {func(c *Config) { c.RoutingKey = "{aggregate}.{event_type}" }, "unknown placeholder {aggregate}"},
		"unclosed":          {func(c *Config) { c.RoutingKey = "{event_type" }, "unclosed"},
		"exchange type":     {func(c *Config) { c.ExchangeType = "tropic" }, `exchange type "tropic"`},
		"negative flight":   {func(c *Config) { c.MaxInFlight = -1 }, "max_in_flight"},
		"negative size":     {func(c *Config) { c.MaxMessageBytes = -1 }, "max_message_bytes"},
		"negative dial":     {func(c *Config) { c.DialTimeout = -time.Second }, "negative"},
		"backoff order":     {func(c *Config) { c.ReconnectBackoffMin, c.ReconnectBackoffMax = time.Minute, time.Second }, "above max"},
		"tls without amqps": {func(c *Config) { c.TLS = &tls.Config{} }, "amqps"},
		"long exchange":     {func(c *Config) { c.Exchange = strings.Repeat("x", 256) }, "255"},
	} {
		c := ok
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want error containing %q", name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error leaks the password: %v", name, err)
		}
	}
	if _, err := New(Config{URL: "amqp://h/", ExchangeType: "x-consistent-hash"}, nil); err != nil {
		t.Errorf("plugin exchange type rejected: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	s, err := New(Config{URL: "amqp://h/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Exchange != "outbox" || c.RoutingKey != "{aggregate_type}.{event_type}" || c.ExchangeType != "topic" ||
		!*c.Durable || c.MaxInFlight != 1000 || c.DialTimeout <= 0 || c.ReconnectBackoffMin <= 0 ||
		c.ReconnectBackoffMax < c.ReconnectBackoffMin || c.MaxMessageBytes != 128<<20 {
		t.Errorf("defaults not applied: %+v", c)
	}
	f := false
	s, _ = New(Config{URL: "amqp://h/", Durable: &f}, nil)
	if *s.cfg.Durable {
		t.Error("Durable=false overridden by the default")
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:guest@127.0.0.1:5672/":      "amqp://guest:xxxxx@127.0.0.1:5672/",
		"amqps://u:p%40ss@host/vhost?heartbeat=5": "amqps://u:xxxxx@host/vhost?heartbeat=5",
		"amqp://user@host/":                       "amqp://user@host/",
		"amqp://host/":                            "amqp://host/",
		// Not parsable by net/url (bad escape), still redacted.
		"amqp://u:pa%zzss@host:5672/": "amqp://u:xxxxx@host:5672/",
		// No scheme at all.
		"u:secret@host:5672": "u:xxxxx@host:5672",
	} {
		if got := redact.URL(in); got != want {
			t.Errorf("redact.URL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactError(t *testing.T) {
	raw := "amqp://user:p%40ssw0rd@host:5672/"
	base := errors.New("dial " + raw + " failed for p@ssw0rd and p%40ssw0rd")
	err := redact.Error(base, raw)
	if s := err.Error(); strings.Contains(s, "ssw0rd") {
		t.Errorf("password left in %q", s)
	}
	if !errors.Is(err, base) {
		t.Error("redacted error does not unwrap to the original")
	}
	if clean := errors.New("no secret here"); redact.Error(clean, raw) != clean {
		t.Error("clean error was rewrapped")
	}
}

// TestConnectUnreachable needs no broker: nothing listens on port 1.
func TestConnectUnreachable(t *testing.T) {
	s, err := New(Config{URL: "amqp://guest:t0psecret@127.0.0.1:1/", DialTimeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Connect(context.Background())
	if err == nil {
		t.Fatal("Connect to a closed port succeeded")
	}
	if strings.Contains(err.Error(), "t0psecret") || !strings.Contains(err.Error(), "guest:xxxxx@127.0.0.1:1") {
		t.Errorf("error not redacted or not naming the url: %v", err)
	}
	t.Log(err)
}

func TestPublishPermanentBeforeSending(t *testing.T) {
	s, err := New(Config{URL: "amqp://h/", RoutingKey: "{table}", MaxMessageBytes: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	long := strings.Repeat("x", 300)
	for name, m := range map[string]*relay.Message{
		"empty key":  {ID: "1", Table: ""},
		"long key":   {ID: "2", Table: long},
		"long id":    {ID: long, Table: "t"},
		"long type":  {ID: "3", Table: "t", EventType: long},
		"large body": {ID: "4", Table: "t", Envelope: []byte("01234567890")},
	} {
		var got error
		calls := 0
		// Publish must fail at once: there is no connection to wait for.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.Publish(ctx, m, func(_ *relay.Message, err error) { calls++; got = err })
		cancel()
		if calls != 1 || got == nil || relay.Retryable(got) || errors.Is(got, context.DeadlineExceeded) {
			t.Errorf("%s: done called %d times with %v, want one permanent error", name, calls, got)
		}
	}
}

// TestPublishContained: a routing key, property or header that is not
// valid UTF-8, and a routing key of the relay's own, fail permanently at
// once, naming what is wrong.
func TestPublishContained(t *testing.T) {
	s, err := New(Config{URL: "amqp://h/", RoutingKey: "{aggregate_type}"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		m    relay.Message
		want string
	}{
		{relay.Message{ID: "1", AggregateType: "caf\xe9"}, `rabbitmq routing key "caf\xe9" is not valid UTF-8`},
		{relay.Message{ID: "2", AggregateType: "__outboxrelay_x"}, `rabbitmq routing key "__outboxrelay_x" is reserved for the relay's own use`},
		{relay.Message{ID: "3", AggregateType: "order", EventType: "cr\xe9ated"}, `event_type (the type property) "cr\xe9ated" is not valid UTF-8`},
		{relay.Message{ID: "4", AggregateType: "order", AggregateID: "\xff"}, `header "aggregate_id" value "\xff" is not valid UTF-8`},
		{relay.Message{ID: "5", AggregateType: "order", Headers: []envelope.Header{{Key: "t", Value: "\xc3"}}}, `header "t" value "\xc3" is not valid UTF-8`},
	} {
		var got error
		calls := 0
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.Publish(ctx, &c.m, func(_ *relay.Message, err error) { calls++; got = err })
		cancel()
		if calls != 1 || relay.Retryable(got) || got == nil || !strings.Contains(got.Error(), c.want) {
			t.Errorf("message %s: done called %d times with %v, want one permanent error containing %s", c.m.ID, calls, got, c.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := backoff.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for i := range 10 {
		d := b.Next()
		if d < 50*time.Millisecond || d > time.Second {
			t.Fatalf("attempt %d: delay %s out of range", i, d)
		}
	}
	if d := b.Next(); d < 500*time.Millisecond {
		t.Errorf("delay after many attempts %s, want at least max/2", d)
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Errorf("delay after reset %s, want at most min", d)
	}
}

// TestHeaderFrameSize checks the frame size prepare computes from the
// message against the publishing it builds, counted property by property,
// with the tag header at its widest.
func TestHeaderFrameSize(t *testing.T) {
	s, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/", Exchange: "ex"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*relay.Message{
		testMessage("frame", 1, 7, "order"),
		{ID: "2", AggregateType: "a", EventType: "e", Format: relay.FormatDebezium, Headers: []envelope.Header{{Key: "k", Value: strings.Repeat("v", 300)}}},
	} {
		p, err := s.prepare(m, func(*relay.Message, error) {})
		if err != nil {
			t.Fatal(err)
		}
		pub := s.publishing(p, math.MaxUint64)
		want := 8 + 14 + 1 + len(pub.ContentType) + 4 + 1 + 1 + len(pub.MessageId) + 8 + 1 + len(pub.Type) + 1 + len(pub.AppId)
		for k, v := range pub.Headers {
			want += 1 + len(k) + 1 + 4 + len(v.(string))
		}
		if p.frame != want {
			t.Errorf("message %s: frame %d, want %d", m.ID, p.frame, want)
		}
	}
}
