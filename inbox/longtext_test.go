package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestLongTextFieldsAreDeadLetters: a delivery whose message id,
// aggregate type or aggregate id is longer than a PostgreSQL index entry
// can hold (random bytes: ~2.7 kB at most, compressed or not) is a dead
// letter like any undecodable message, alone or in a batch, never an error
// that Receive returns on every redelivery (which stops the runner on that
// message for good).
func TestLongTextFieldsAreDeadLetters(t *testing.T) {
	f := newFixture(t, nil, Config{})
	ctx := context.Background()
	long := func() string {
		b := make([]byte, 4000)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(b)
	}
	ran := 0
	h := func(context.Context, pgx.Tx, Message) error { ran++; return nil }
	var raws []Raw
	for _, attr := range []string{"ce_id", "aggregate_type", "ce_subject"} {
		hdr := map[string]string{"ce_specversion": "1.0", "ce_id": "id-" + attr, "ce_type": "t", "aggregate_type": "acct", "ce_subject": "acct-1"}
		hdr[attr] = long()
		raw := Raw{Value: []byte(`{"amount":1}`), Headers: hdr}
		raws = append(raws, raw)
		for range 2 { // the redelivery finds the same dead letter
			res, err := f.in.Receive(ctx, raw, h)
			if err != nil || res.Outcome != DeadLettered || !errors.Is(res.Err, ErrUndecodable) {
				t.Fatalf("long %s: %v, %v (%v); want dead-lettered as undecodable", attr, res.Outcome, err, res.Err)
			}
		}
	}
	rs, err := f.in.ReceiveBatch(ctx, raws, h)
	if err != nil {
		t.Fatalf("batch: %v", err)
	}
	for i, r := range rs {
		if r.Outcome != DeadLettered {
			t.Fatalf("batch result %d: %v; want dead-lettered", i, r.Outcome)
		}
	}
	if ran != 0 {
		t.Fatalf("the handler ran %d times", ran)
	}
	st, err := f.in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 3 {
		t.Fatalf("%d dead letters, want 3", len(st.DeadLetters))
	}
}
