package inbox

import (
	"context"
	"testing"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestBatchWithPoisonTwiceAndADuplicate: one ReceiveBatch holds a poison
// message twice (the same id), a good message twice and an undecodable
// delivery. Every delivery is decided; the poison message is one dead
// letter, the good one runs once; after the replay every message is
// applied exactly once, in order.
func TestBatchWithPoisonTwiceAndADuplicate(t *testing.T) {
	msgs := ledger.Generate(4, 2)
	msgs[0].Poison = true
	f := newFixture(t, msgs, Config{MaxAttempts: 2})
	ctx := context.Background()
	raws := []Raw{raw(msgs[0]), raw(msgs[1]), raw(msgs[0]), {Value: []byte("{")}, raw(msgs[1]), raw(msgs[2]), raw(msgs[3])}
	rs, err := f.in.ReceiveBatch(ctx, raws, f.handler)
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{DeadLettered, Processed, DeadLettered, DeadLettered, Processed, Parked, Processed}
	for i, r := range rs {
		if r.Outcome != want[i] {
			t.Fatalf("result %d: %v, want %v (all: %v)", i, r.Outcome, want[i], rs)
		}
	}
	st, err := f.in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 2 {
		t.Fatalf("%d dead letters, want 2 (the poison message once, the undecodable one)", len(st.DeadLetters))
	}
	f.poisoned.Store(false)
	for _, d := range st.DeadLetters {
		if d.MessageID == msgs[0].ID {
			if _, err := f.in.Replay(ctx, d.ID, f.handler); err != nil {
				t.Fatal(err)
			}
		}
	}
	if r := f.check(t); !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
}
