package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckConfigTemplates: --check-config rejects a typo in any sink's
// destination template, naming the key, as run does.
func TestCheckConfigTemplates(t *testing.T) {
	for _, tc := range []struct{ sink, want string }{
		{"type: kafka\n  kafka:\n    brokers: [127.0.0.1:9092]\n    topic: \"outbox.{aggregate_typo}\"", "sink.kafka.topic"},
		{"type: rabbitmq\n  rabbitmq:\n    url: amqp://guest:guest@127.0.0.1:5672/\n    routing_key: \"{aggregate_typo}.{event_type}\"", "routing_key"},
		{"type: nats\n  nats:\n    subject: \"outbox.{aggregate_typo}\"", "sink.nats.subject"},
		{"type: redis\n  redis:\n    stream: \"outbox:{aggregate_typo}\"", "sink.redis.stream"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			cfg := "postgres:\n  url: postgres://relay@127.0.0.1/shop\nsink:\n  " + tc.sink + "\n"
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			if code := runMain([]string{"run", "--check-config", "--config", path}, &out, &errOut); code != exitUsage {
				t.Fatalf("exit %d, want 2; stdout:\n%s", code, out.String())
			}
			if got := errOut.String(); !strings.Contains(got, tc.want) || !strings.Contains(got, "{aggregate_typo}") || strings.Count(got, "\n") != 1 {
				t.Fatalf("stderr %q, want one line naming %s and the placeholder", got, tc.want)
			}
		})
	}
}
