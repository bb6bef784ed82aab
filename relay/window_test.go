package relay

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// holdSink acknowledges nothing until the test releases messages. It tests
// the in-flight window's bound, not delivery: delivery is proven against
// real brokers in integration/.
type holdSink struct {
	mu       sync.Mutex
	held     []*Message
	done     []func(*Message, error)
	total    int // handed over so far
	maxHeld  int // most unacknowledged at once
	maxBytes int // most unacknowledged envelope bytes at once
	bytes    int
}

func (s *holdSink) Publish(_ context.Context, m *Message, done func(*Message, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = append(s.held, m)
	s.done = append(s.done, done)
	s.total++
	s.bytes += len(m.Envelope)
	s.maxHeld = max(s.maxHeld, len(s.held))
	s.maxBytes = max(s.maxBytes, s.bytes)
}

// release acknowledges the n oldest unacknowledged messages.
func (s *holdSink) release(n int) {
	s.mu.Lock()
	n = min(n, len(s.held))
	ms, dones := s.held[:n:n], s.done[:n:n]
	s.held, s.done = s.held[n:], s.done[n:]
	for _, m := range ms {
		s.bytes -= len(m.Envelope)
	}
	s.mu.Unlock()
	for i, m := range ms {
		dones[i](m, nil)
	}
}

func (s *holdSink) counts() (total, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total, len(s.held)
}

func (s *holdSink) Ready() bool  { return true }
func (s *holdSink) Close() error { return nil }

// windowSource hands the relay n messages, each of its own aggregate (so
// that the per-aggregate order holds none back), in one transaction. With
// askRoom it asks Room before each, as cdc.Stream does, and records where
// the relay said it was full; without, it relies on the handler blocking.
type windowSource struct {
	n       int
	askRoom bool
	handed  atomic.Int64
	mu      sync.Mutex
	fullAt  []int
}

func (f *windowSource) full() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.fullAt...)
}

func (f *windowSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	if err := h.Begin(ctx, cdc.Begin{FinalLSN: 100}); err != nil {
		return err
	}
	for i := range f.n {
		if f.askRoom {
			if room := h.Room(); room != nil {
				f.mu.Lock()
				f.fullAt = append(f.fullAt, i)
				f.mu.Unlock()
				select {
				case <-room:
				case <-ctx.Done():
					return nil
				}
			}
		}
		c := fmt.Sprintf(`{"id":"m%03d","aggregate_type":"order","aggregate_id":"%03d","event_type":"x","payload":{}}`, i, i)
		if err := h.Message(ctx, &cdc.LogicalMessage{Transactional: true, LSN: cdc.LSN(10 + i), Prefix: "outboxrelay", Content: []byte(c)}); err != nil {
			return err
		}
		f.handed.Add(1)
	}
	if err := h.Commit(ctx, cdc.Commit{EndLSN: 200}); err != nil {
		return err
	}
	return h.Drain(ctx)
}

// TestWindowBoundsMessagesInFlight: a sink that acknowledges nothing holds
// at most relay.max_inflight messages (and max_inflight_bytes), the source
// is held back at the bound, and it goes on as acknowledgements free room.
func TestWindowBoundsMessagesInFlight(t *testing.T) {
	const n = 60
	for _, tc := range []struct {
		name     string
		cfg      Config
		askRoom  bool
		wantHeld int // 0: bounded by bytes, checked below
	}{
		{"messages, blocking", Config{MaxInFlight: 10}, false, 10},
		{"messages, asking for room", Config{MaxInFlight: 10}, true, 10},
		{"bytes, asking for room", Config{MaxInFlight: 1000, MaxInFlightBytes: 2000}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &holdSink{}
			r := New(tc.cfg, s, nil, Options{})
			src := &windowSource{n: n, askRoom: tc.askRoom}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx, src) }()

			// settled waits until the sink's count stops changing.
			settled := func() (total, held int) {
				t.Helper()
				last := -1
				for range 200 {
					time.Sleep(20 * time.Millisecond)
					total, held = s.counts()
					if total == last && total > 0 {
						return total, held
					}
					last = total
				}
				t.Fatalf("the sink's count did not settle: %d", total)
				return 0, 0
			}
			total, held := settled()
			if tc.wantHeld > 0 && (total != tc.wantHeld || held != tc.wantHeld) {
				t.Fatalf("with nothing acknowledged the sink was handed %d messages (%d unacknowledged), want the window's %d", total, held, tc.wantHeld)
			}
			if tc.wantHeld == 0 {
				if s.maxBytes > 2000 || total < 2 || total >= n {
					t.Fatalf("with nothing acknowledged the sink was handed %d messages of %d bytes, want as many as fit in 2000 bytes", total, s.maxBytes)
				}
			}
			if got := int(src.handed.Load()); got != total {
				t.Fatalf("the source handed over %d messages while the sink holds %d: it was not held back at the bound", got, total)
			}
			if full := src.full(); tc.askRoom && (len(full) != 1 || full[0] != total) {
				t.Fatalf("Room reported the window full before messages %v, want before message %d only", full, total)
			}
			if r.InFlight() != total {
				t.Fatalf("InFlight() = %d, want %d", r.InFlight(), total)
			}

			// Three acknowledgements free room for exactly three more.
			s.release(3)
			total2, held2 := settled()
			if total2 != total+3 || held2 != held {
				t.Fatalf("after 3 acknowledgements the sink was handed %d in all (%d unacknowledged), want %d (%d)", total2, held2, total+3, held)
			}

			// Acknowledge everything as it comes: the source reaches its end.
			for done := false; !done; {
				s.release(n)
				select {
				case err := <-errc:
					if err != nil {
						t.Fatal(err)
					}
					done = true
				case <-time.After(10 * time.Millisecond):
				}
			}
			if total, _ := s.counts(); total != n || src.handed.Load() != n {
				t.Fatalf("sink was handed %d, source handed over %d, want %d", total, src.handed.Load(), n)
			}
			if bound := tc.cfg.MaxInFlight; s.maxHeld > bound {
				t.Fatalf("the sink held %d unacknowledged at once, over max_inflight %d", s.maxHeld, bound)
			}
			if tc.cfg.MaxInFlightBytes > 0 && int64(s.maxBytes) > tc.cfg.MaxInFlightBytes {
				t.Fatalf("the sink held %d unacknowledged bytes at once, over max_inflight_bytes %d", s.maxBytes, tc.cfg.MaxInFlightBytes)
			}
			if got := r.handler.Confirmed(); got != 200 {
				t.Fatalf("confirmed %v, want 200 once everything was acknowledged", got)
			}
		})
	}
}
