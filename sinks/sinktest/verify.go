package sinktest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// CheckVerifyReader publishes n messages through s and reads them back with
// the reader settings gives the verify command: the reader must pass every
// published id exactly once (it may pass ids of other messages too) and
// close cleanly.
func CheckVerifyReader(t *testing.T, s relay.Sink, settings sinks.Verifiable, opts sinks.VerifyOptions, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	since := time.Now().Add(-time.Minute)
	msgs := Messages(aggregateType("verify"), n, 4)
	PublishAll(ctx, t, s, msgs)

	rd, dest, err := settings.VerifyReader(opts)
	if err != nil {
		t.Fatalf("VerifyReader: %v", err)
	}
	var dests []string
	if dest != nil {
		seen := map[string]bool{}
		for _, m := range msgs {
			d, err := dest(m)
			if err != nil {
				t.Fatalf("destination of %s: %v", m.ID, err)
			}
			if !seen[d] {
				seen[d] = true
				dests = append(dests, d)
			}
		}
	}
	count := map[string]int{}
	if err := rd.Read(ctx, since, dests, func(id string) error { count[id]++; return nil }); err != nil {
		t.Fatalf("Read: %v", err)
	}
	if err := rd.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	missing, dups := 0, 0
	for _, m := range msgs {
		switch c := count[m.ID]; {
		case c == 0:
			missing++
		case c > 1:
			dups += c - 1
		}
	}
	if missing > 0 || dups > 0 {
		t.Errorf("the verify reader read %d of %d published ids back: %d missing, %d duplicated", n-missing, n, missing, dups)
	}
}
