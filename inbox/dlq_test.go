package inbox

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestReplayRequestedLease: a replay requested from outside (RequestReplay)
// is run by ReplayRequested. One stopped by shutdown keeps its request,
// and its lease keeps other calls off it until it ends; two processes of
// the consumer calling at once then run the chain once, in order.
func TestReplayRequestedLease(t *testing.T) {
	msgs := ledger.Generate(20, 2)
	poison := 2 * 3 // acct-000's 4th message
	msgs[poison].Poison = true
	f := newFixture(t, msgs, Config{MaxAttempts: 2})
	ctx := context.Background()
	for _, m := range msgs {
		f.receive(t, m)
	}
	st, err := f.in.Status(ctx)
	if err != nil || len(st.Parked) != 1 {
		t.Fatalf("status = %+v, %v; want one parked aggregate", st, err)
	}
	id, waiting := st.Parked[0].DeadLetterID, st.Parked[0].Waiting
	if _, err := RequestReplay(ctx, f.pool, "", id, "billing", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := RequestReplay(ctx, f.pool, "", id, "", "test"); !errors.Is(err, ErrReplayPending) {
		t.Fatalf("a second request: %v, want ErrReplayPending", err)
	}
	f.poisoned.Store(false)

	// Shutdown in the middle: the request stays, under its lease.
	stopCtx, stop := context.WithCancel(ctx)
	stopping := func(ctx context.Context, tx pgx.Tx, m Message) error { stop(); return ctx.Err() }
	if _, err := f.in.ReplayRequested(stopCtx, stopping); !errors.Is(err, context.Canceled) {
		t.Fatalf("ReplayRequested stopped by shutdown: %v, want context.Canceled", err)
	}
	if res, err := f.in.ReplayRequested(ctx, f.handler); err != nil || res.Processed != 0 {
		t.Fatalf("ReplayRequested under another's lease: %+v, %v; want nothing run", res, err)
	}
	if _, err := f.pool.Exec(ctx, `UPDATE inbox.dead_letters SET replay_claimed_until = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}

	other, err := New(f.pool, "billing", Config{MinBackoff: f.in.cfg.MinBackoff, MaxBackoff: f.in.cfg.MaxBackoff})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]ReplayResult, 2)
	errs := make([]error, 2)
	for i, in := range []*Inbox{f.in, other} {
		wg.Go(func() { results[i], errs[i] = in.ReplayRequested(ctx, f.handler) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || results[0].Processed+results[1].Processed != waiting+1 {
		t.Fatalf("two processes: %+v, %v; want %d processed between them", results, errs, waiting+1)
	}
	if r := f.check(t); !r.ExactlyOnce() {
		t.Errorf("%v; want every message once, in order", r)
	}
	if _, err := RequestReplay(ctx, f.pool, "", id, "", "test"); !errors.Is(err, ErrNotParked) {
		t.Errorf("a request after the release: %v, want ErrNotParked", err)
	}
}
