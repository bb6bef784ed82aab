package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestConfigProblemsOnePerLine: `run` without --config reports each
// missing setting on a line of its own, and a mistyped OUTBOXRELAY_
// variable is named with the key it probably meant.
func TestConfigProblemsOnePerLine(t *testing.T) {
	t.Setenv("OUTBOXRELAY_POSTGRES_URL", "")
	t.Setenv("OUTBOXRELAY_SINK_TYPE", "kafka")
	t.Setenv("OUTBOXRELAY_SINK_KAFKA_BROKERS", "")
	t.Setenv("OUTBOXRELAY_RELAY_MAXINFLIGHT", "10")
	var out, errOut bytes.Buffer
	if code := runMain([]string{"run"}, &out, &errOut); code != exitUsage {
		t.Fatalf("exit %d, want 2; stderr: %s", code, errOut.String())
	}
	want := []string{
		"outboxrelay: warning: environment OUTBOXRELAY_RELAY_MAXINFLIGHT is not a configuration key and is ignored; did you mean OUTBOXRELAY_RELAY_MAX_INFLIGHT?",
		"outboxrelay: invalid configuration, 2 problems:",
		"  postgres.url is required (or OUTBOXRELAY_POSTGRES_URL)",
		"  sink.kafka.brokers is empty; list at least one broker as host:port",
	}
	if got := strings.TrimSuffix(errOut.String(), "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("stderr:\n%s\nwant:\n%s", errOut.String(), strings.Join(want, "\n"))
	}
}
