package consumertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// Lag is a lag test's fixture: an inbox over a fresh database whose
// handler holds every message until Release, and the lag readings its
// Observer got.
type Lag struct {
	In      *inbox.Inbox
	Msgs    []ledger.Msg
	Handler inbox.Handler
	release chan struct{}
	mu      sync.Mutex
	last    map[string]int64
}

// NewLag returns the fixture with n messages over 4 accounts.
func NewLag(t *testing.T, n int) *Lag {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l := &Lag{Msgs: ledger.Generate(n, 4), release: make(chan struct{}), last: map[string]int64{}}
	if err := ledger.Setup(ctx, pool, l.Msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	l.In, err = inbox.New(pool, Name, inbox.Config{Observer: inbox.Observer{Lag: func(source string, n int64) {
		l.mu.Lock()
		l.last[source] = n
		l.mu.Unlock()
	}}})
	if err != nil {
		t.Fatal(err)
	}
	l.Handler = func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		select {
		case <-l.release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return ledger.Apply(ctx, tx, m.ID, m.Payload, false)
	}
	return l
}

// Check runs run (a Runner's Run over l.In and l.Handler) and checks the
// lag it reports: blocked while the handler holds the messages, then 0
// once they are released and acknowledged; then it stops run.
func (l *Lag) Check(t *testing.T, blocked int64, run func(context.Context) error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	l.WaitTotal(t, blocked, 30*time.Second)
	close(l.release)
	l.WaitTotal(t, 0, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// WaitTotal waits until the last readings of every source add up to want.
func (l *Lag) WaitTotal(t *testing.T, want int64, within time.Duration) {
	t.Helper()
	var sum int64
	var sources int
	WaitFor(t, "the lag readings", within, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		sum, sources = 0, len(l.last)
		for _, n := range l.last {
			sum += n
		}
		return sources > 0 && sum == want
	})
	t.Logf("lag %d over %d sources", sum, sources)
}
