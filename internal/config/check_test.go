package config

import (
	"strings"
	"testing"
)

// A merge key (<<: *anchor) is checked as the keys it merges.
func TestConfigMergeKey(t *testing.T) {
	body := "postgres:\n  url: postgres://relay@127.0.0.1:5432/shop\n  <<: {slot: orders}\nrelay:\n  <<: [{max_attempts: 3}]\nsink:\n  kafka:\n    brokers: [127.0.0.1:9092]\n"
	cfg, err := Load(writeTemp(t, "relay.yaml", body), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.Slot != "orders" || cfg.Relay.MaxAttempts != 3 {
		t.Fatalf("merged keys not applied: slot %q, max_attempts %d", cfg.Postgres.Slot, cfg.Relay.MaxAttempts)
	}
	_, err = Load(writeTemp(t, "relay.yaml", "postgres:\n  url: postgres://relay@127.0.0.1:5432/shop\n  <<: {slott: orders}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "line 3: postgres.slott is not a configuration key") {
		t.Fatalf("a typo inside a merged mapping: %v", err)
	}
}

// A wrong key or value in the file is reported by its YAML key and line,
// never by the Go type it would be decoded into.
func TestConfigErrorsNameKeyAndLine(t *testing.T) {
	const head = "postgres:\n  url: postgres://relay@127.0.0.1:5432/shop\n"
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"wrong type", head + "  slot: [a, b]\n", []string{"line 3", "postgres.slot", "must be a string, not a list"}},
		{"unknown key", head + "  slott: orders\n", []string{"line 3", "postgres.slott is not a configuration key", "did you mean postgres.slot?"}},
		{"unknown key far from any", head + "  zzzzzz: 1\n", []string{"line 3", "postgres.zzzzzz", "the keys of postgres are url,"}},
		{"bad duration", head + "  status_interval: 5x\n", []string{"line 3", "postgres.status_interval", `"5x" is not a duration such as 10s`}},
		{"not a number", head + "relay:\n  max_inflight: lots\n", []string{"line 4", "relay.max_inflight", `"lots" is not a whole number`}},
		{"not a bool", head + "relay:\n  dead_letters: maybe\n", []string{"line 4", "relay.dead_letters", "true or false"}},
		{"section is a scalar", head + "relay: 5\n", []string{"line 3", "relay must be a mapping of keys (max_inflight,"}},
		{"kafka list is a scalar", head + "sink:\n  type: kafka\n  kafka:\n    brokers: 127.0.0.1:9092\n",
			[]string{"line 6", "sink.kafka.brokers must be a list"}},
		{"kafka bad duration", head + "sink:\n  type: kafka\n  kafka:\n    brokers: [127.0.0.1:9092]\n    linger: soon\n",
			[]string{"line 7", "sink.kafka.linger", `"soon" is not a duration`}},
		{"kafka nested unknown key", head + "sink:\n  type: kafka\n  kafka:\n    sasl:\n      mechansim: PLAIN\n",
			[]string{"line 7", "sink.kafka.sasl.mechansim is not a configuration key", "did you mean sink.kafka.sasl.mechanism?"}},
		{"kafka nested wrong type", head + "sink:\n  type: kafka\n  kafka:\n    tls: true\n",
			[]string{"line 6", "sink.kafka.tls must be a mapping of keys"}},
		{"unknown sink section", head + "sink:\n  type: kafka\n  kafak: {}\n", []string{"line 5", "sink.kafak is not a configuration key", "did you mean sink.kafka?"}},
		{"merged mapping", head + "defaults: &d\n  max_attempts: many\nrelay:\n  <<: *d\n", []string{"line 3", "defaults is not a configuration key"}},
		{"rabbitmq wrong type", head + "sink:\n  type: rabbitmq\n  rabbitmq:\n    exchange: [a]\n",
			[]string{"line 6", "sink.rabbitmq.exchange must be a string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeTemp(t, "relay.yaml", tc.body), nil)
			if err == nil {
				t.Fatal("loaded a bad file")
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			for _, leak := range []string{"!!", "config.", "time.Duration", "[]string", "kafka.Config", "type "} {
				if strings.Contains(msg, leak) {
					t.Errorf("error %q shows a Go or YAML type (%q)", msg, leak)
				}
			}
		})
	}
}

// Every problem of a configuration is reported, not only the first: two
// mistyped keys, a bad value in the file, a bad environment value and the
// values Validate refuses.
func TestLoadReportsEveryProblem(t *testing.T) {
	body := "postgres:\n  url: postgres://relay@127.0.0.1:5432/shop\n  slott: orders\n  status_interval: 5x\nsink:\n  kafka:\n    brokerz: [a]\n"
	_, err := Load(writeTemp(t, "relay.yaml", body), env(map[string]string{"OUTBOXRELAY_RELAY_MAX_ATTEMPTS": "many", "OUTBOXRELAY_LOG_LEVEL": "loud"}))
	want := []string{
		"line 3: postgres.slott is not a configuration key",
		`line 4: postgres.status_interval "5x" is not a duration`,
		"line 7: sink.kafka.brokerz is not a configuration key",
		`environment OUTBOXRELAY_RELAY_MAX_ATTEMPTS: "many" is not an integer`,
	}
	problems := Problems(err)
	if len(problems) != len(want) {
		t.Errorf("%d problems, want %d: %q", len(problems), len(want), problems)
	}
	for i, w := range want {
		if i >= len(problems) || !strings.Contains(problems[i].Error(), w) {
			t.Errorf("problem %d is %v, want %q", i, problems, w)
		}
	}

	// A file that decodes: its values are checked with the environment's.
	body = "postgres:\n  url: postgres://relay@127.0.0.1:5432/shop\n  status_interval: 1h\nsink:\n  kafka:\n    brokers: [a:9092]\nrelay:\n  max_inflight: 0\n"
	_, err = Load(writeTemp(t, "relay.yaml", body), env(map[string]string{"OUTBOXRELAY_LOG_LEVEL": "loud"}))
	want = []string{"postgres.status_interval 1h0m0s must be between", "relay.max_inflight must be at least 1", `log.level "loud" is not one of`}
	problems = Problems(err)
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d: %q", len(problems), len(want), problems)
	}
	for i, w := range want {
		if !strings.Contains(problems[i].Error(), w) {
			t.Errorf("problem %d is %q, want %q", i, problems[i], w)
		}
	}
}

// A mistyped OUTBOXRELAY_ variable is named with the closest key, one far
// from every key is named alone; a variable that is a key is not.
func TestUnknownEnv(t *testing.T) {
	got := UnknownEnv([]string{"OUTBOXRELAY_RELAY_MAXINFLIGHT=10", "OUTBOXRELAY_SINK_KAFKA_BROKERS=a:9092", "OUTBOXRELAY_POSTGRES_URL_FILE=/run/url",
		"OUTBOXRELAY_POSTGRES_SLOTT=x", "HOME=/root", "OUTBOXRELAYX=1", "OUTBOXRELAY_PG_VERSION=15"})
	want := []string{
		"environment OUTBOXRELAY_RELAY_MAXINFLIGHT is not a configuration key and is ignored; did you mean OUTBOXRELAY_RELAY_MAX_INFLIGHT?",
		"environment OUTBOXRELAY_POSTGRES_SLOTT is not a configuration key and is ignored; did you mean OUTBOXRELAY_POSTGRES_SLOT?",
		"environment OUTBOXRELAY_PG_VERSION is not a configuration key and is ignored; no key is close (docs/configuration.md lists them)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
