package kafka

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

func TestValidate(t *testing.T) {
	ok := Config{Brokers: []string{"127.0.0.1:9092"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "sink.kafka.brokers is empty"},
		{Config{Brokers: []string{" "}}, "not a host:port"},
		{Config{Brokers: ok.Brokers, Topic: "outbox.{aggregate}"}, "unknown placeholder {aggregate}"},
		{Config{Brokers: ok.Brokers, Topic: "outbox.{aggregate_type"}, "without '}'"},
		{Config{Brokers: ok.Brokers, Topic: "outbox}"}, "without '{'"},
		{Config{Brokers: ok.Brokers, Topic: "outbox/{aggregate_type}"}, `contains '/'`},
		{Config{Brokers: ok.Brokers, Topic: ".."}, "not allowed"},
		{Config{Brokers: ok.Brokers, Linger: -time.Millisecond}, "sink.kafka.linger"},
		{Config{Brokers: ok.Brokers, MaxInFlight: -1}, "sink.kafka.max_inflight"},
		{Config{Brokers: ok.Brokers, MaxMessageBytes: 100}, "sink.kafka.max_message_bytes"},
		{Config{Brokers: ok.Brokers, DialTimeout: -time.Second}, "sink.kafka.dial_timeout"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate() = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestTemplate(t *testing.T) {
	m := &relay.Message{AggregateType: "order", EventType: "order.created", Table: "public.outbox"}
	for _, tc := range []struct{ tmpl, want string }{
		{"outbox.{aggregate_type}", "outbox.order"},
		{"{aggregate_type}", "order"},
		{"{table}.{event_type}", "public.outbox.order.created"},
		{"{aggregate_type}-{aggregate_type}_x", "order-order_x"},
		{"all-events", "all-events"},
	} {
		tmpl, err := parseTemplate(tc.tmpl, DefaultPositionsTopic)
		if err != nil {
			t.Fatalf("%q: %v", tc.tmpl, err)
		}
		r := newTopics(tmpl, DefaultPositionsTopic).render(m)
		if r.err != nil || r.topic != tc.want {
			t.Errorf("%q rendered %q, %v; want %q", tc.tmpl, r.topic, r.err, tc.want)
		}
	}
}

func TestCheckTopic(t *testing.T) {
	for _, ok := range []string{"a", "outbox.order", "A-Z_0.9", "...", strings.Repeat("x", 249)} {
		if err := checkTopic(ok, DefaultPositionsTopic); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a b", "a/b", "ä", "a:b", strings.Repeat("x", 250)} {
		if checkTopic(bad, DefaultPositionsTopic) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestTopicCacheBounded renders more distinct topics than the cache holds.
func TestTopicCacheBounded(t *testing.T) {
	tmpl, _ := parseTemplate("outbox.{aggregate_type}", DefaultPositionsTopic)
	ts := newTopics(tmpl, DefaultPositionsTopic)
	for i := range maxCachedTopics + 10 {
		m := &relay.Message{AggregateType: strings.Repeat("a", i%7) + string(rune('a'+i%26)) + strings.Repeat("b", i/26%50) + string(rune('0'+i/1300))}
		r := ts.render(m)
		if r.err != nil || r.topic != "outbox."+m.AggregateType {
			t.Fatalf("render %q: %q, %v", m.AggregateType, r.topic, r.err)
		}
	}
	if n := len(ts.cache); n > maxCachedTopics {
		t.Errorf("cache holds %d topics, limit %d", n, maxCachedTopics)
	}
}

// TestInternalTopicsRefused: no row reaches the exactly-once positions
// topic or one of Kafka's internal topics, whatever the template renders;
// a template that can only render such a topic fails at start-up.
func TestInternalTopicsRefused(t *testing.T) {
	tmpl, err := parseTemplate("{aggregate_type}", DefaultPositionsTopic)
	if err != nil {
		t.Fatal(err)
	}
	ts := newTopics(tmpl, DefaultPositionsTopic)
	for _, agg := range []string{DefaultPositionsTopic, "__outboxrelay_other", "__consumer_offsets", "__transaction_state", "__cluster_metadata"} {
		r := ts.render(&relay.Message{AggregateType: agg})
		if r.err == nil || !strings.Contains(r.err.Error(), "no row may address it") {
			t.Errorf("aggregate_type %q rendered topic %q, %v; want it refused as internal", agg, r.topic, r.err)
		}
	}
	if r := ts.render(&relay.Message{AggregateType: "_schemas_like"}); r.err != nil {
		t.Errorf("a topic with one leading underscore was refused: %v", r.err)
	}
	// A positions topic of another name is just as internal.
	ts = newTopics(tmpl, "relay-positions")
	if r := ts.render(&relay.Message{AggregateType: "relay-positions"}); r.err == nil {
		t.Error("the configured positions topic was accepted")
	}
	for _, bad := range []string{DefaultPositionsTopic, "__consumer_offsets", "__{aggregate_type}", "__outboxrelay_{event_type}"} {
		if _, err := parseTemplate(bad, DefaultPositionsTopic); err == nil || !strings.Contains(err.Error(), "no row may address it") {
			t.Errorf("parseTemplate(%q) = %v, want it refused as internal", bad, err)
		}
	}
}

// TestTopicErrorNamesCharacter: an illegal character is shown as the
// character, not as its first byte ('Ã' for 'é'), and a byte that is not
// UTF-8 as its hex value.
func TestTopicErrorNamesCharacter(t *testing.T) {
	tmpl, _ := parseTemplate("outbox.{aggregate_type}", DefaultPositionsTopic)
	ts := newTopics(tmpl, DefaultPositionsTopic)
	if r := ts.render(&relay.Message{AggregateType: "café"}); r.err == nil || !strings.Contains(r.err.Error(), "contains 'é'") {
		t.Errorf("topic error %v; want it to name 'é'", r.err)
	}
	if _, err := parseTemplate("outbox.café.{aggregate_type}", DefaultPositionsTopic); err == nil || !strings.Contains(err.Error(), "contains 'é'") {
		t.Errorf("template error %v; want it to name 'é'", err)
	}
	if r := ts.render(&relay.Message{AggregateType: "caf\xe9"}); r.err == nil || !strings.Contains(r.err.Error(), "not valid UTF-8 (byte 0xE9 at offset 10)") {
		t.Errorf("topic error %v; want it to say the topic is not valid UTF-8", r.err)
	}
}

// TestRelayOnly: only the relay's own sink is transactional, with the
// slot's transactional.id unless one is set; every other sink is not, and
// settings without exactly_once are the same for both.
func TestRelayOnly(t *testing.T) {
	eo := &Config{Brokers: []string{"a:9092"}, ExactlyOnce: true}
	if got := eo.ForRelay("orders").(*Config); !got.ExactlyOnce || got.TransactionalID != TransactionalID("orders") {
		t.Errorf("ForRelay: exactly_once %v, transactional_id %q", got.ExactlyOnce, got.TransactionalID)
	}
	if eo.TransactionalID != "" {
		t.Errorf("ForRelay changed the configuration: transactional_id %q", eo.TransactionalID)
	}
	set := &Config{Brokers: []string{"a:9092"}, ExactlyOnce: true, TransactionalID: "mine"}
	if got := set.ForRelay("orders").(*Config); got.TransactionalID != "mine" {
		t.Errorf("ForRelay replaced transactional_id mine with %q", got.TransactionalID)
	}
	if got := eo.Detached().(*Config); got.ExactlyOnce || !eo.ExactlyOnce {
		t.Errorf("Detached: exactly_once %v (original %v)", got.ExactlyOnce, eo.ExactlyOnce)
	}
	plain := &Config{Brokers: []string{"a:9092"}}
	if plain.ForRelay("orders") != sinks.Settings(plain) || plain.Detached() != sinks.Settings(plain) {
		t.Error("settings without exactly_once are not used as they are")
	}
}
