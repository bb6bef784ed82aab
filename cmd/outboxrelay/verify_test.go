package main

import (
	"testing"
	"time"

	rows "github.com/outboxrelay/outboxrelay/replay"
)

// TestUncoveredPart: the part of a verify window that lies before what
// postgres.retention keeps, as of now.
func TestUncoveredPart(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	h := func(n float64) time.Time { return now.Add(-time.Duration(n * float64(time.Hour))) }
	for _, tc := range []struct {
		name         string
		since, until time.Time
		retention    time.Duration
		want         time.Duration
		to           time.Time
	}{
		{"no retention", h(10), time.Time{}, 0, 0, time.Time{}},
		{"within retention", h(1), time.Time{}, 2 * time.Hour, 0, time.Time{}},
		{"reaching past it", h(4), time.Time{}, time.Hour, 3 * time.Hour, h(1)},
		{"ending before the cutoff", h(4), h(2), time.Hour, 2 * time.Hour, h(2)},
		{"until in the future", h(3), now.Add(time.Hour), time.Hour, 2 * time.Hour, h(1)},
		{"starting at the cutoff", h(1), time.Time{}, time.Hour, 0, time.Time{}},
	} {
		got := uncoveredPart(rows.Filter{Since: tc.since, Until: tc.until}, tc.retention, now)
		if got.length != tc.want || (tc.want > 0 && (!got.to.Equal(tc.to) || !got.from.Equal(tc.since))) {
			t.Errorf("%s: uncovered %s from %s to %s, want %s to %s", tc.name, got.length, got.from, got.to, tc.want, tc.to)
		}
	}
	if s := uncoveredPart(rows.Filter{Since: h(4)}, time.Hour, now).String(); s != "3h0m0s of the window's 4h0m0s (75%) lies past postgres.retention (1h0m0s)" {
		t.Errorf("String() = %q", s)
	}
}
