package backoff

import (
	"testing"
	"time"
)

func TestExponential(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		lo, hi  time.Duration
		attempt int
		want    time.Duration
	}{
		{100 * ms, 30 * time.Second, 0, 100 * ms},
		{100 * ms, 30 * time.Second, 1, 100 * ms},
		{100 * ms, 30 * time.Second, 2, 200 * ms},
		{100 * ms, 30 * time.Second, 5, 1600 * ms},
		{100 * ms, 30 * time.Second, 10, 30 * time.Second},
		{100 * ms, 30 * time.Second, 1 << 30, 30 * time.Second},
		{time.Duration(1<<62 - 1), time.Duration(1<<63 - 1), 64, time.Duration(1<<63 - 1)},
		{time.Second, 100 * ms, 1, 100 * ms}, // hi below lo caps
		{0, time.Second, 5, 0},
	} {
		if got := Exponential(c.lo, c.hi, c.attempt); got != c.want {
			t.Errorf("Exponential(%v, %v, %d) = %v, want %v", c.lo, c.hi, c.attempt, got, c.want)
		}
	}
}

func TestJitterRange(t *testing.T) {
	if got := Jitter(0); got != 0 {
		t.Errorf("Jitter(0) = %v", got)
	}
	if got := Jitter(-time.Second); got != 0 {
		t.Errorf("Jitter(-1s) = %v", got)
	}
	d := 100 * time.Millisecond
	seen := map[bool]bool{}
	for range 1000 {
		got := Jitter(d)
		if got < d/2 || got > d {
			t.Fatalf("Jitter(%v) = %v, outside [d/2, d]", d, got)
		}
		seen[got < 3*d/4] = true
	}
	if !seen[true] || !seen[false] {
		t.Errorf("1000 draws of Jitter(%v) all fell in one half of the range", d)
	}
}

func TestBackoffDoublesAndResets(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for i, hi := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		hi *= time.Millisecond
		if d := b.Next(); d < hi/2 || d > hi {
			t.Fatalf("wait %d: %v, want in [%v, %v]", i+1, d, hi/2, hi)
		}
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Errorf("wait after Reset %v, want at most Min", d)
	}
}

// The counter stops at Max, so a Backoff that retries for days keeps
// returning Max-sized waits instead of overflowing.
func TestBackoffStopsCountingAtMax(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: time.Hour}
	for range 10_000 {
		b.Next()
	}
	if b.attempt > 32 {
		t.Errorf("attempt counter %d kept growing past Max", b.attempt)
	}
	if d := b.Next(); d < 30*time.Minute {
		t.Errorf("wait after 10000 attempts %v, want at least Max/2", d)
	}
}
