package inboxprom

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outboxrelay/inbox"
)

func TestObserverCounts(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	obs, err := Observer(reg, "billing")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Observer(reg, "billing") // a second inbox of the same consumer
	if err != nil {
		t.Fatal(err)
	}
	m := inbox.Message{ID: "m"}
	obs.Processed(m, 3*time.Millisecond)
	again.Processed(m, time.Millisecond)
	obs.Duplicate(m)
	obs.Retried(m, 1, errors.New("x"))
	obs.DeadLettered(m, errors.New("x"))
	obs.Parked(m)
	obs.Parked(m)
	obs.Stale(m)
	obs.Lag("deposits/0", 9)
	obs.Lag("deposits/0", 7) // a gauge: the last reading
	again.Lag("deposits/1", 3)
	want := map[string]float64{"processed_total": 2, "duplicates_total": 1, "retries_total": 1,
		"dead_letters_total": 1, "parked_total": 2, "stale_total": 1, "lag/deposits/0": 7, "lag/deposits/1": 3}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		name := strings.TrimPrefix(mf.GetName(), "outboxrelay_inbox_")
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() != "billing" {
				t.Errorf("%s: label %v", name, m.GetLabel())
			}
			if c := m.GetCounter(); c != nil {
				got[name] += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				got[name+"/"+m.GetLabel()[1].GetValue()] = g.GetValue()
			}
		}
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "outboxrelay_inbox_handler_seconds"); err != nil || n != 1 {
		t.Errorf("handler_seconds: %d series, %v", n, err)
	}
}
