package sinks

import (
	"strings"
	"testing"
)

func TestRenamedInt(t *testing.T) {
	r := Renamed{Sink: "nats", Old: "max_pending", New: "max_inflight"}
	for _, tc := range []struct {
		old, cur, want int
		conflict       bool
	}{
		{0, 0, 0, false},     // neither: the caller's default applies
		{0, 100, 100, false}, // the default
		{7, 100, 7, false},   // the old key over the default
		{7, 0, 7, false},     // the old key over an unset new one
		{0, 9, 9, false},     // the new key
		{7, 7, 7, false},     // both, the same
		{7, 9, 9, true},      // both, different
	} {
		if got := r.Int(tc.old, tc.cur, 100); got != tc.want {
			t.Errorf("Int(%d, %d, 100) = %d, want %d", tc.old, tc.cur, got, tc.want)
		}
		err := r.CheckInt(tc.old, tc.cur, 100)
		if (err != nil) != tc.conflict {
			t.Errorf("CheckInt(%d, %d, 100) = %v, want conflict %v", tc.old, tc.cur, err, tc.conflict)
		}
	}
	if w := r.Warning(); !strings.Contains(w, "sink.nats.max_pending is deprecated") || !strings.Contains(w, "sink.nats.max_inflight") {
		t.Errorf("warning %q", w)
	}
}
