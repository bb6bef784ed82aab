package inbox

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
)

// TestJSONBodyNotUTF8IsUndecodable: encoding/json reads a byte that is not
// UTF-8 as U+FFFD, so two envelopes whose ids differ only in such bytes
// would decode to one id, and the second would be dropped as a duplicate
// of the first with no one told. The relay writes UTF-8 only: such a body
// is a dead letter, each under its own content, in both JSON formats.
func TestJSONBodyNotUTF8IsUndecodable(t *testing.T) {
	msgs := ledger.Generate(1, 1)
	f := newFixture(t, msgs, Config{})
	ctx := context.Background()
	env := msgs[0].Envelope()
	ce := []byte(`{"specversion":"1.0","id":"` + msgs[0].ID + `","type":"t","source":"s","subject":"a","data":{}}`)
	ran := 0
	h := func(context.Context, pgx.Tx, Message) error { ran++; return nil }
	for _, body := range [][]byte{env, ce} {
		for _, b := range []string{"\xff", "\xfe"} {
			v := bytes.Replace(body, []byte(msgs[0].ID), []byte("id-"+b), 1)
			if _, err := Decode(FormatAuto, Raw{Value: v}); !errors.Is(err, ErrUndecodable) {
				t.Errorf("%s: Decode error %v, want ErrUndecodable", v, err)
			}
			res, err := f.in.Receive(ctx, Raw{Value: v}, h)
			if err != nil || res.Outcome != DeadLettered {
				t.Fatalf("%s: %v, %v; want dead-lettered", v, res.Outcome, err)
			}
		}
	}
	if ran != 0 {
		t.Fatalf("the handler ran %d times", ran)
	}
}
