// Package backoff computes the waits between retries: exponential, capped,
// and with equal jitter, so that relays restarted together do not retry in
// step. It is the one place the relay, cdc, replay and the sinks take their
// retry delays from.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jitter returns a duration drawn uniformly from [d/2, d] ("equal jitter":
// at least half the wait is kept, so a retry never fires at once). A d of 0
// or less returns 0. Safe for concurrent use.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Exponential returns the wait before the given attempt (1 for the first
// retry) without jitter: lo doubled attempt-1 times, never above hi. An
// attempt below 1 counts as 1, and hi below lo caps the wait at hi. The
// doubling stops at hi, so a large attempt cannot overflow.
func Exponential(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 1; i < attempt && d > 0 && d < hi; i++ {
		if d > hi/2 {
			d = hi
			break
		}
		d *= 2
	}
	return min(d, hi)
}

// Delay is Jitter(Exponential(lo, hi, attempt)): the wait before a retry
// counted by its caller.
func Delay(lo, hi time.Duration, attempt int) time.Duration {
	return Jitter(Exponential(lo, hi, attempt))
}

// Backoff counts attempts for its caller: each Next waits about twice as
// long as the one before, from Min up to Max, and Reset starts again at Min
// (after a success). The zero value with Min and Max set is ready to use.
// A Backoff is owned by one goroutine; it is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	attempt  int // the attempt Next returns the wait for, minus one
}

// Next returns the jittered wait before the next attempt and counts it.
func (b *Backoff) Next() time.Duration {
	d := Exponential(b.Min, b.Max, b.attempt+1)
	if d < b.Max {
		b.attempt++
	}
	return Jitter(d)
}

// Reset makes the next wait Min again.
func (b *Backoff) Reset() { b.attempt = 0 }
