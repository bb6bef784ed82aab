package inbox

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestDiscardRecordsAndReleasesChain: an operator discards a dead letter
// with a reason; the decision is stored, its message never runs (not even
// when redelivered), the messages parked behind it run in order and the
// aggregate is released. The status view counts the dead letter and the
// chain before, and nothing after.
func TestDiscardRecordsAndReleasesChain(t *testing.T) {
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
	view, err := StatusAll(ctx, f.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	waiting := int64(st.Parked[0].Waiting)
	if len(view) != 1 || view[0].Consumer != "billing" || view[0].DeadLetters != 1 || view[0].ParkedAggregates != 1 ||
		view[0].ParkedMessages != waiting || view[0].LastMessageID == "" || view[0].LastProcessedAt.IsZero() {
		t.Fatalf("status view = %+v, want billing with 1 dead letter, 1 parked aggregate, %d waiting", view, waiting)
	}

	id := st.DeadLetters[0].ID
	if _, err := f.in.Discard(ctx, id, "", f.handler); !errors.Is(err, ErrDiscardReason) {
		t.Fatalf("discard without a reason: %v, want ErrDiscardReason", err)
	}
	// Still poisoned: the discarded message must not run, its chain must.
	rr, err := f.in.Discard(ctx, id, "refund issued by hand, ticket 123", f.handler)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Processed != int(waiting) {
		t.Errorf("discard ran %d of the chain, want %d", rr.Processed, waiting)
	}
	var reason string
	var discarded bool
	if err := f.pool.QueryRow(ctx, `SELECT discard_reason, discarded_at IS NOT NULL FROM inbox.dead_letters WHERE id = $1`, id).
		Scan(&reason, &discarded); err != nil || reason != "refund issued by hand, ticket 123" || !discarded {
		t.Errorf("recorded decision: %q, %v, %v", reason, discarded, err)
	}
	if res := f.receive(t, msgs[poison]); res.Outcome != Duplicate {
		t.Errorf("redelivery of the discarded message: %v, want duplicate", res.Outcome)
	}
	if _, err := f.in.Discard(ctx, id, "again", f.handler); !errors.Is(err, ErrNotParked) {
		t.Errorf("second discard: %v, want ErrNotParked", err)
	}
	r := f.check(t)
	if r.Doubles != 0 || r.Missing != 1 || r.Runs != len(msgs)-1 {
		t.Errorf("%v; want every message but the discarded one, once", r)
	}
	// acct-000's runs: its seqs in order, the discarded 4th left out.
	rows, err := f.pool.Query(ctx, `SELECT seq FROM ledger WHERE account = 'acct-000' ORDER BY run`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	want := []int{1, 2, 3, 5, 6, 7, 8, 9, 10}
	if !slices.Equal(seqs, want) {
		t.Errorf("acct-000 ran %v, want %v", seqs, want)
	}
	if view, err = StatusAll(ctx, f.pool, ""); err != nil || len(view) != 1 || view[0].DeadLetters != 0 || view[0].ParkedMessages != 0 {
		t.Errorf("status view after the discard = %+v, %v; want nothing waiting", view, err)
	}
}
