package inbox

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestHandlerPanicIsAFailedAttempt: a handler that panics after writing
// (an index out of range on an odd payload) is a failed
// attempt like a returned error: its writes and its dedupe record roll
// back, it is retried, then dead-lettered with its aggregate parked,
// alone and in a batch. A panic that escaped would crash the runner, and
// the redelivery after the restart would crash it again, for good. A
// replay then applies every message exactly once, in order.
func TestHandlerPanicIsAFailedAttempt(t *testing.T) {
	msgs := ledger.Generate(12, 2)
	f := newFixture(t, msgs, Config{MaxAttempts: 2})
	ctx := context.Background()
	var panicking atomic.Bool
	panicking.Store(true)
	bad := map[string]bool{msgs[2].ID: true, msgs[7].ID: true} // acct-000, acct-001
	panics := 0
	h := func(ctx context.Context, tx pgx.Tx, m Message) error {
		if err := ledger.Apply(ctx, tx, m.ID, m.Payload, false); err != nil {
			return err
		}
		if panicking.Load() && bad[m.ID] {
			panics++
			var none []byte
			_ = none[len(m.ID)] // index out of range
		}
		return nil
	}
	for _, l := range msgs[:4] { // one by one: msgs[2] panics, msgs[3] is behind it
		res, err := f.in.Receive(ctx, raw(l), h)
		if err != nil {
			t.Fatalf("receive %s: %v", l.ID, err)
		}
		want := Processed
		switch l.ID {
		case msgs[2].ID:
			want = DeadLettered
			if res.Err == nil || !strings.Contains(res.Err.Error(), "panic") {
				t.Errorf("dead letter's error %v; want it to name the panic", res.Err)
			}
		}
		if l.Account == msgs[2].Account && l.Seq > msgs[2].Seq {
			want = Parked
		}
		if res.Outcome != want {
			t.Fatalf("%s: %v, want %v", l.ID, res.Outcome, want)
		}
	}
	raws := make([]Raw, 0, len(msgs)-4)
	for _, l := range msgs[4:] { // in a batch: msgs[7] panics
		raws = append(raws, raw(l))
	}
	rs, err := f.in.ReceiveBatch(ctx, raws, h)
	if err != nil {
		t.Fatalf("batch: %v", err)
	}
	for i, r := range rs {
		if r.Outcome == 0 {
			t.Fatalf("batch result %d undecided", i)
		}
		if id := msgs[4+i].ID; id == msgs[7].ID && r.Outcome != DeadLettered {
			t.Fatalf("batch: the panicking %s is %v, want dead-lettered", id, r.Outcome)
		}
	}
	if panics < 4 {
		t.Fatalf("%d panics, want at least 4 (2 attempts of 2 messages)", panics)
	}
	st, err := f.in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 2 {
		t.Fatalf("%d dead letters, want 2", len(st.DeadLetters))
	}
	panicking.Store(false)
	for _, d := range st.DeadLetters {
		if _, err := f.in.Replay(ctx, d.ID, h); err != nil {
			t.Fatal(err)
		}
	}
	if r := f.check(t); !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
}
