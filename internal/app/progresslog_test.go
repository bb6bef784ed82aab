package app

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestProgressLines: a line every 30 s while a backlog is worked off, one
// when it drains, and nothing while idle.
func TestProgressLines(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	var acks uint64
	inflight := 0
	p := &progressLog{
		log: zap.New(core), interval: 30 * time.Second,
		acknowledged: func() uint64 { return acks },
		inFlight:     func() int { return inflight },
		lagBytes:     func() (int64, bool) { return 4096, true },
		lagSeconds:   func() float64 { return 12.34 },
	}
	start := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	p.lastAt = start
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }

	for s := 1; s <= 60; s++ { // idle for a minute
		p.step(at(s))
	}
	if logs.Len() != 0 {
		t.Fatalf("idle relay logged %v", logs.AllUntimed())
	}
	inflight = 500
	for s := 61; s <= 130; s++ { // 100 messages a second for 70 s
		acks += 100
		p.step(at(s))
	}
	inflight = 0
	p.step(at(131))
	p.step(at(132))
	for s := 133; s <= 200; s++ {
		p.step(at(s))
	}
	entries := logs.AllUntimed()
	var msgs []string
	for _, e := range entries {
		msgs = append(msgs, e.Message)
	}
	if len(entries) != 3 || msgs[0] != "progress" || msgs[1] != "progress" || msgs[2] != "backlog drained" {
		t.Fatalf("lines %q, want two progress lines then backlog drained", msgs)
	}
	f := entries[1].ContextMap()
	if f["published"] != uint64(3000) || f["rate_per_second"] != 100.0 || f["lag_bytes"] != int64(4096) ||
		f["lag_seconds"] != 12.3 || f["inflight"] != int64(500) {
		t.Errorf("progress line fields %v", f)
	}
	d := entries[2].ContextMap()
	if d["published"] != uint64(7000) || d["inflight"] != int64(0) || d["took"] != 70*time.Second {
		t.Errorf("drained line fields %v", d)
	}
}
