package sinktest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/relay"
)

// VerifyNoLeaks checks for leaked goroutines after every cleanup of the
// test, those of its fixtures included.
func VerifyNoLeaks(tb testing.TB) {
	tb.Cleanup(func() { goleak.VerifyNone(tb) })
}

// PublishAll publishes msgs through s, in order, and fails t unless every
// one is acknowledged before ctx ends, exactly once.
func PublishAll(ctx context.Context, t testing.TB, s relay.Sink, msgs []*relay.Message) {
	t.Helper()
	tr := NewTracker(msgs)
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)
}

// RunnerSink is a sink that sends from its own Run.
type RunnerSink interface {
	relay.Sink
	relay.Runner
}

// RunSink runs s until the test ends, then closes it, failing tb when Run
// or Close returns an error.
func RunSink(tb testing.TB, s RunnerSink) {
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			tb.Errorf("Run: %v", err)
		}
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
}

// Recorder collects the outcome reported for each message, for tests that
// publish messages not known in advance (a Tracker needs them). Done is
// safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	errs  map[*relay.Message]error
	calls map[*relay.Message]int
	n     chan struct{}
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{errs: map[*relay.Message]error{}, calls: map[*relay.Message]int{}, n: make(chan struct{}, 1<<20)}
}

// Done is the done callback to pass to Publish.
func (r *Recorder) Done(m *relay.Message, err error) {
	r.mu.Lock()
	r.errs[m] = err
	r.calls[m]++
	r.mu.Unlock()
	r.n <- struct{}{}
}

// Reported is the number of done calls so far.
func (r *Recorder) Reported() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

// Wait waits up to d for n outcomes and returns the error of each message
// reported, failing tb when a message was reported more than once.
func (r *Recorder) Wait(tb testing.TB, n int, d time.Duration) map[*relay.Message]error {
	tb.Helper()
	deadline := time.After(d)
	for i := 0; i < n; i++ {
		select {
		case <-r.n:
		case <-deadline:
			tb.Fatalf("%d of %d outcomes after %s", i, n, d)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for m, c := range r.calls {
		if c != 1 {
			tb.Errorf("message %s reported %d times", m.ID, c)
		}
	}
	return r.errs
}

// BenchmarkPublish publishes msgs through s as the relay does, Publish in
// a loop, timing until every outcome is in, and reports msgs/s. It fails b
// when a message is not acknowledged. len(msgs) should be b.N.
func BenchmarkPublish(b *testing.B, s relay.Sink, msgs []*relay.Message) {
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	var mu sync.Mutex
	var failed error
	done := func(_ *relay.Message, err error) {
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
		wg.Done()
	}
	ctx := context.Background()

	b.ResetTimer()
	for _, m := range msgs {
		s.Publish(ctx, m, done)
	}
	wg.Wait()
	b.StopTimer()

	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}

// Connector is a sink that connects in a step of its own.
type Connector interface {
	relay.Sink
	Connect(ctx context.Context) error
}

// CheckUnreachable connects s, whose broker URL holds the password secret
// and names a port nothing listens on, and fails t unless Connect fails
// with an error that hides secret and names each of want (the setting to
// check), and s is not Ready after. It closes s.
func CheckUnreachable(t testing.TB, s Connector, secret string, want ...string) {
	t.Helper()
	defer s.Close()
	err := s.Connect(context.Background())
	if err == nil {
		t.Fatal("Connect to a closed port succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error shows the password: %v", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not name %s: %v", w, err)
		}
	}
	if s.Ready() {
		t.Error("Ready after a failed Connect")
	}
}

// RenamedInt checks how a sink resolves an int key that has a deprecated
// old name (sinks.Renamed): resolve returns the value the sink uses when
// the old key holds old and the new one cur. The old key counts while the
// new one is unset or holds its default def; the new key wins otherwise.
func RenamedInt(tb testing.TB, def int, resolve func(old, cur int) int) {
	tb.Helper()
	for _, c := range []struct{ old, cur, want int }{{7, 0, 7}, {7, def, 7}, {7, 9, 9}, {0, 9, 9}} {
		if got := resolve(c.old, c.cur); got != c.want {
			tb.Errorf("old key %d, new key %d: the sink uses %d, want %d", c.old, c.cur, got, c.want)
		}
	}
}
