package console

import (
	"sync"
	"time"
)

// Sample is one pipeline's figures at one moment. A figure that was not
// known (the pipeline was not connected, the slot had no position yet)
// is nil, and the chart leaves a gap there rather than drawing a zero.
type Sample struct {
	At               time.Time `json:"at"`
	State            string    `json:"state"`
	LagSeconds       *float64  `json:"lag_seconds"`
	LagBytes         *int64    `json:"lag_bytes"`
	RetainedWALBytes *int64    `json:"retained_wal_bytes"`
	PublishedTotal   *int64    `json:"published_total"`
	// PublishedPerSecond is the rise of PublishedTotal since the sample
	// before, per second; nil for the first sample, across a gap, or when
	// the total went down (the slot was dropped and made again).
	PublishedPerSecond *float64 `json:"published_per_second"`
}

// History keeps the last samples of each pipeline in a ring of fixed
// size, so that its memory does not grow with uptime. It is safe for
// concurrent use.
type History struct {
	mu    sync.Mutex
	size  int
	rings map[string]*ring
}

type ring struct {
	samples []Sample
	next    int // where the next sample goes once samples is full
}

// NewHistory keeps size samples per pipeline (at least 2).
func NewHistory(size int) *History {
	return &History{size: max(size, 2), rings: map[string]*ring{}}
}

// Add records s for pipeline, computing its PublishedPerSecond from the
// sample before it.
func (h *History) Add(pipeline string, s Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[pipeline]
	if r == nil {
		r = &ring{samples: make([]Sample, 0, h.size)}
		h.rings[pipeline] = r
	}
	if prev, ok := r.last(); ok && prev.PublishedTotal != nil && s.PublishedTotal != nil && *s.PublishedTotal >= *prev.PublishedTotal {
		if secs := s.At.Sub(prev.At).Seconds(); secs > 0 {
			rate := float64(*s.PublishedTotal-*prev.PublishedTotal) / secs
			s.PublishedPerSecond = &rate
		}
	}
	if len(r.samples) < h.size {
		r.samples = append(r.samples, s)
		return
	}
	r.samples[r.next] = s
	r.next = (r.next + 1) % h.size
}

func (r *ring) last() (Sample, bool) {
	if len(r.samples) == 0 {
		return Sample{}, false
	}
	if len(r.samples) < cap(r.samples) || r.next == 0 {
		return r.samples[len(r.samples)-1], true
	}
	return r.samples[r.next-1], true
}

// Samples returns pipeline's samples, oldest first, as a copy.
func (h *History) Samples(pipeline string) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[pipeline]
	if r == nil {
		return []Sample{}
	}
	out := make([]Sample, 0, len(r.samples))
	out = append(out, r.samples[r.next:]...)
	return append(out, r.samples[:r.next]...)
}
