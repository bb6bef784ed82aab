package inbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestHandlerThatEndsTheTransaction: a handler that commits or rolls back
// the inbox's transaction itself and returns nil. Committed, its writes
// and the dedupe record are in: the message is decided (a duplicate of
// itself), never an error on every redelivery. Rolled back, nothing is:
// the attempt failed and, after its retries, the message is a dead letter
// rather than a delivery that comes back for good.
func TestHandlerThatEndsTheTransaction(t *testing.T) {
	msgs := ledger.Generate(2, 2)
	f := newFixture(t, msgs, Config{MaxAttempts: 2})
	ctx := context.Background()
	commits := func(ctx context.Context, tx pgx.Tx, m Message) error {
		if err := f.handler(ctx, tx, m); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	res, err := f.in.Receive(ctx, raw(msgs[0]), commits)
	if err != nil || (res.Outcome != Processed && res.Outcome != Duplicate) {
		t.Fatalf("handler that commits: %v, %v; want decided", res.Outcome, err)
	}
	rollsBack := func(ctx context.Context, tx pgx.Tx, m Message) error {
		if err := f.handler(ctx, tx, m); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	}
	for _, want := range []Outcome{DeadLettered, Duplicate} { // the redelivery finds the dead letter
		res, err = f.in.Receive(ctx, raw(msgs[1]), rollsBack)
		if err != nil || res.Outcome != want {
			t.Fatalf("handler that rolls back: %v, %v; want %v", res.Outcome, err, want)
		}
	}
	if r := f.check(t); r.Runs != 1 || r.Doubles != 0 {
		t.Fatalf("ledger: %v; want the committed message's one run", r)
	}
}
