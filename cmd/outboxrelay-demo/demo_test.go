package main

import (
	"bytes"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
)

// TestDemo runs the whole demo, as `make demo` does, and checks what it
// shows: the committed orders with their topics, keys and event types, the
// trace id taken from the traceparent, the checkpoint, and no trace of the
// rolled-back order. The demo checks the records itself too; this test
// checks that the reader is shown them.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	// The Pub/Sub client's dependency, OpenCensus, starts one worker for
	// the life of the process when its package is initialised (every sink
	// registers itself in this binary), so that one is not the demo's.
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
	var out, logs bytes.Buffer
	err := demo(t.Context(), &out, &logs)
	if errors.Is(err, pgserver.ErrNoBinaries) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v; CI must install them (see .ci/services)", err)
		}
		t.Skipf("%v (set CI=true to make this a failure)", err)
	}
	if err != nil {
		t.Fatalf("demo: %v\noutput:\n%s\nrelay log:\n%s", err, out.String(), logs.String())
	}
	got := out.String()
	t.Logf("output:\n%s", got)

	for _, re := range []string{
		`(?m)^==> starting PostgreSQL`,
		`(?m)^==> starting Kafka`,
		`(?m)^==> starting outboxrelay`,
		`(?m)^\s+outbox\.order\s+\d+@\d+\s+1001\s+order\.created\s+` + sampleTraceID + `\s+\{.*"order_id":1001`,
		`(?m)^\s+outbox\.customer\s+\d+@\d+\s+bob\s+customer\.registered\s+[0-9a-f]{32}\s+\{"customer":"bob"\}`,
		`(?m)^\s+outbox\.order\s+\d+@\d+\s+1002\s+order\.created\s+[0-9a-f]{32}\s+\{.*"order_id":1002`,
		`(?m)^\s+outbox\.order\s+\d+@\d+\s+1001\s+order\.paid\s+[0-9a-f]{32}\s+\{.*"method":"card"`,
		`(?m)^\s+confirmed_flush_lsn\s+[0-9A-F]+/[0-9A-F]+$`,
		`(?m)^\s+lag_bytes\s+\d+$`,
		`(?m)^==> stopping PostgreSQL and removing its temporary data`,
		`(?m)^==> done in `,
	} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("output does not match %s", re)
		}
	}
	// The rolled-back order is announced as such, and appears in no record line.
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, "outbox.") && (strings.Contains(line, "1003") || strings.Contains(line, "carol")) {
			t.Errorf("rolled-back order 1003 was consumed: %s", line)
		}
	}
	// order.paid comes after order.created for the same aggregate.
	if !regexp.MustCompile(`(?s)1001\s+order\.created\s.*1001\s+order\.paid\s`).MatchString(got) {
		t.Errorf("order 1001's events are not shown in commit order")
	}
	if logs.Len() > 0 {
		t.Errorf("the relay logged warnings or errors:\n%s", logs.String())
	}
}
