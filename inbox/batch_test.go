package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestProcessBatchIsolatesAFailingHandler: a batch holds a poison message
// whose handler fails with an SQL error (which aborts a transaction, not
// just returns), a duplicate inside the batch and, in a second batch,
// redeliveries of the first and a duplicate inside it. The others' effects commit exactly once; the
// poison message is dead-lettered after its attempts and its successors in
// the batch are parked behind it, not run ahead of it; a replay then
// releases them in order.
func TestProcessBatchIsolatesAFailingHandler(t *testing.T) {
	msgs := ledger.Generate(60, 6)
	poison := 6*3 + 2 // acct-002's 4th message
	msgs[poison].Poison = true
	f := newFixture(t, msgs, Config{MaxAttempts: 3})
	ctx := context.Background()
	h := func(ctx context.Context, tx pgx.Tx, m Message) error {
		err := f.handler(ctx, tx, m)
		if errors.Is(err, ledger.ErrPoison) {
			_, err = tx.Exec(ctx, "SELECT 1 / 0") // the transaction is aborted now
		}
		return err
	}
	decode := func(ls []ledger.Msg) []Message {
		ms := make([]Message, len(ls))
		for i, l := range ls {
			m, err := Decode(FormatAuto, raw(l))
			if err != nil {
				t.Fatal(err)
			}
			ms[i] = m
		}
		return ms
	}
	batch := append(append([]ledger.Msg{}, msgs[:40]...), msgs[10:15]...)
	results, err := f.in.ProcessBatch(ctx, decode(batch), h)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(batch) {
		t.Fatalf("%d results for %d messages", len(results), len(batch))
	}
	var processed, dups, parked, dead int
	for i, r := range results {
		if r.Message.ID != batch[i].ID {
			t.Fatalf("result %d is for %s, want %s (the order of the batch)", i, r.Message.ID, batch[i].ID)
		}
		switch r.Outcome {
		case Processed:
			processed++
		case Duplicate:
			dups++
		case Parked:
			parked++
			if batch[i].Account != "acct-002" || batch[i].Seq <= msgs[poison].Seq {
				t.Errorf("message %d (%s seq %d) parked; only acct-002's after seq %d should be", i, batch[i].Account, batch[i].Seq, msgs[poison].Seq)
			}
		case DeadLettered:
			dead++
			if batch[i].ID != msgs[poison].ID || r.Attempts != 3 {
				t.Errorf("message %d dead-lettered after %d attempts; only the poison one, after 3", i, r.Attempts)
			}
		}
	}
	// acct-002 has seqs 1 to 7 in msgs[:40]; 4 is the poison one.
	if processed != 36 || dups != 5 || parked != 3 || dead != 1 {
		t.Errorf("processed %d, duplicates %d, parked %d, dead-lettered %d; want 36, 5, 3, 1", processed, dups, parked, dead)
	}
	// No handler fails in this one: one transaction, one claim statement
	// for all, a duplicate inside the batch again.
	second := append(append([]ledger.Msg{}, msgs[30:]...), msgs[45:48]...)
	results, err = f.in.ProcessBatch(ctx, decode(second), h)
	if err != nil {
		t.Fatal(err)
	}
	dups = 0
	for _, r := range results {
		if r.Outcome == Duplicate {
			dups++
		}
	}
	if len(results) != 33 || dups != 13 {
		t.Errorf("second batch: %d results, %d duplicates; want 33 and 13 (msgs[30:40] again, msgs[45:48] twice)", len(results), dups)
	}
	st, err := f.in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 {
		t.Fatalf("status = %+v, want one dead letter", st)
	}
	f.poisoned.Store(false)
	if _, err := f.in.Replay(ctx, st.DeadLetters[0].ID, f.handler); err != nil {
		t.Fatal(err)
	}
	r := f.check(t)
	t.Logf("batches of 45 and 33: %v", r)
	if !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
}

// TestReceiveBatchAlignsResults: ReceiveBatch's Results are aligned with
// its raws: an undecodable one is dead-lettered in its place, a poison
// message falls back to its own attempts and is dead-lettered, the rest
// commit once, and a second copy in the batch is decided with the first.
func TestReceiveBatchAlignsResults(t *testing.T) {
	msgs := ledger.Generate(10, 3)
	msgs[4].Poison = true
	f := newFixture(t, msgs, Config{MaxAttempts: 2})
	ctx := context.Background()
	raws := []Raw{raw(msgs[0]), {Value: []byte("not an envelope")}}
	for _, m := range msgs[1:] {
		raws = append(raws, raw(m))
	}
	raws = append(raws, raw(msgs[2]))
	results, err := f.in.ReceiveBatch(ctx, raws, f.handler)
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{Processed, DeadLettered}
	for i := range msgs[1:] {
		switch {
		case i+1 == 4:
			want = append(want, DeadLettered)
		case (i+1)%3 == 1 && i+1 > 4:
			want = append(want, Parked) // behind the poison one, acct-001
		default:
			want = append(want, Processed)
		}
	}
	want = append(want, Processed) // the copy of msgs[2], decided with it
	if len(results) != len(raws) {
		t.Fatalf("%d results for %d raws", len(results), len(raws))
	}
	for i, r := range results {
		if r.Outcome != want[i] {
			t.Errorf("raw %d: %v, want %v", i, r.Outcome, want[i])
		}
	}
	r, err := ledger.Check(ctx, f.pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if r.Doubles != 0 || r.Runs != len(msgs)-2 {
		t.Errorf("%v; want %d runs, no doubles (1 dead, 1 parked)", r, len(msgs)-2)
	}
}
