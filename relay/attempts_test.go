package relay

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestMaxAttemptsCountsRefusals: retryable failures (an outage) use up none
// of relay.max_attempts. With MaxAttempts 3, a message nacked six times and
// then refused twice is delivered on its next attempt, and one nacked six
// times and then refused every time is dead-lettered after its third
// refusal, recording its nine failed attempts.
func TestMaxAttemptsCountsRefusals(t *testing.T) {
	script := func(id string, attempt int) fault {
		switch {
		case attempt <= 6:
			return nack // the broker is down
		case id == "m0" && attempt <= 8:
			return returned // refused twice, then taken
		case id == "m1":
			return returned // refused for good
		}
		return deliver
	}
	s := newScriptedSink(script)
	var mu sync.Mutex
	dead := map[string]Message{}
	store := func(_ context.Context, m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		dead[m.ID] = *m
		return nil
	}
	r := New(Config{RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond, MaxAttempts: 3}, s, nil, Options{DeadLetters: DeadLetterFunc(store)})
	src := &aggregateSource{msgs: 2, aggregates: 2, txSize: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx, src); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if m, ok := dead["m0"]; ok {
		t.Errorf("m0 dead-lettered after %d attempts (%d refusals); it was refused twice, under max_attempts 3", m.Attempts, m.Refusals)
	}
	if n := s.attempts["m0"]; n != 9 || len(s.stored) != 1 || s.stored[0].ID != "m0" {
		t.Errorf("m0: %d attempts, stored %d messages; want 9 attempts and m0 stored", n, len(s.stored))
	}
	m, ok := dead["m1"]
	if !ok {
		t.Fatalf("m1 not dead-lettered after %d attempts", s.attempts["m1"])
	}
	if n := s.attempts["m1"]; n != 9 || m.Attempts != 9 || m.Refusals != 3 {
		t.Errorf("m1: %d attempts at the sink, dead letter records %d attempts and %d refusals; want 9, 9 and 3", n, m.Attempts, m.Refusals)
	}
	if got := r.handler.Confirmed(); got != src.lastEnd {
		t.Errorf("confirmed %v, want %v", got, src.lastEnd)
	}
}
