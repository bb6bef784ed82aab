package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestBytesPostgreSQLTextCannotHold: a delivery whose message id is not
// UTF-8 or holds a NUL byte (a broker header is bytes), or whose headers
// do, is a dead letter or parked like any other, never an error that
// Receive returns on every redelivery (which stops the runner on that
// message for good); a parked message's headers come back intact in the
// replay.
func TestBytesPostgreSQLTextCannotHold(t *testing.T) {
	msgs := ledger.Generate(4, 1)
	msgs[0].Poison = true
	f := newFixture(t, msgs, Config{MaxAttempts: 1})
	ctx := context.Background()
	for _, id := range []string{"a\x00b", "a\xffb"} {
		raw := Raw{Value: []byte(`{"amount":1}`), Headers: map[string]string{"ce_specversion": "1.0", "ce_id": id, "ce_type": "t", "ce_subject": "acct-000"}}
		for range 2 {
			res, err := f.in.Receive(ctx, raw, f.handler)
			if err != nil || res.Outcome != DeadLettered || !errors.Is(res.Err, ErrUndecodable) {
				t.Fatalf("message id %q: %v, %v (%v); want dead-lettered as undecodable", id, res.Outcome, err, res.Err)
			}
		}
		raw = Raw{Value: []byte("not json"), Headers: map[string]string{"h": id}}
		if res, err := f.in.Receive(ctx, raw, f.handler); err != nil || res.Outcome != DeadLettered {
			t.Fatalf("undecodable delivery with header %q: %v, %v; want dead-lettered", id, res.Outcome, err)
		}
	}
	// acct-000 parks behind its first message; the next one carries a
	// header PostgreSQL's jsonb cannot hold.
	if res := f.receive(t, msgs[0]); res.Outcome != DeadLettered {
		t.Fatalf("poison message: %v", res.Outcome)
	}
	odd := Raw{Key: []byte(msgs[1].Account), Value: msgs[1].Envelope(), Headers: map[string]string{"x-odd": "a\x00\xffb"}}
	res, err := f.in.Receive(ctx, odd, f.handler)
	if err != nil || res.Outcome != Parked {
		t.Fatalf("parked message with an odd header: %v, %v; want parked", res.Outcome, err)
	}
	st, err := f.in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var head int64
	for _, d := range st.DeadLetters {
		if d.MessageID == msgs[0].ID {
			head = d.ID
		}
	}
	if head == 0 || len(st.DeadLetters) != 5 {
		t.Fatalf("status = %+v; want 5 dead letters, one of them %s", st, msgs[0].ID)
	}
	f.poisoned.Store(false)
	var seen string
	if _, err := f.in.Replay(ctx, head, func(ctx context.Context, tx pgx.Tx, m Message) error {
		if m.ID == msgs[1].ID {
			seen = m.Raw.Headers["x-odd"]
		}
		return f.handler(ctx, tx, m)
	}); err != nil {
		t.Fatal(err)
	}
	if seen != "a\x00\xffb" {
		t.Errorf("the parked message's header came back as %q, want %q", seen, "a\x00\xffb")
	}
	for _, m := range msgs[2:] {
		f.receive(t, m)
	}
	if r := f.check(t); !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
}
