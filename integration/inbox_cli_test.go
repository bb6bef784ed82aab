package integration

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// TestInboxMigrateAndStatus: `migrate --inbox --print` prints the inbox's
// SQL, `migrate --inbox` creates it (twice: idempotent), and `inbox status`
// shows a consumer's last processed message, its dead letter and the
// aggregate parked behind it, exiting 1 while the dead letter waits and 0
// once a replay released it.
func TestInboxMigrateAndStatus(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	out, code := e.cli("migrate", "--inbox", "--print")
	if code != 0 || !strings.Contains(out, "CREATE TABLE IF NOT EXISTS \"inbox\".processed") || !strings.Contains(out, "VIEW \"inbox\".status") {
		t.Fatalf("migrate --inbox --print: exit %d\n%s", code, out)
	}
	if out, code := e.cli("migrate", "--inbox", "--slot", "x", "--database-url", e.dbURL); code != 2 || !strings.Contains(out, "--slot") {
		t.Errorf("migrate --inbox --slot: exit %d, want 2 naming --slot\n%s", code, out)
	}
	for range 2 {
		if out, code := e.cli("migrate", "--inbox", "--database-url", e.dbURL); code != 0 || !strings.Contains(out, "migrated: inbox") {
			t.Fatalf("migrate --inbox: exit %d\n%s", code, out)
		}
	}
	if out, code := e.cli("inbox", "status", "--database-url", e.dbURL); code != 0 || !strings.Contains(out, "no consumer") {
		t.Fatalf("inbox status of an empty inbox: exit %d\n%s", code, out)
	}

	pool, err := pgxpool.New(ctx, e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	in, err := inbox.New(pool, "billing", inbox.Config{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	h := func(context.Context, pgx.Tx, inbox.Message) error {
		if fail {
			return errors.New("card declined")
		}
		return nil
	}
	msg := func(id string) inbox.Message {
		return inbox.Message{ID: id, AggregateType: "order", AggregateID: "7", EventType: "paid", Payload: []byte(`{}`)}
	}
	if res, err := in.Process(ctx, msg("m1"), h); err != nil || res.Outcome != inbox.DeadLettered {
		t.Fatalf("m1: %+v, %v; want dead-lettered", res, err)
	}
	for _, id := range []string{"m2", "m3"} {
		if res, err := in.Process(ctx, msg(id), h); err != nil || res.Outcome != inbox.Parked {
			t.Fatalf("%s: %+v, %v; want parked", id, res, err)
		}
	}
	other := inbox.Message{ID: "m4", AggregateType: "order", AggregateID: "8", EventType: "paid", Payload: []byte(`{}`)}
	fail = false
	if res, err := in.Process(ctx, other, h); err != nil || res.Outcome != inbox.Processed {
		t.Fatalf("m4: %+v, %v; want processed", res, err)
	}

	out, code = e.cli("inbox", "status", "--database-url", e.dbURL, "--json")
	var sts []map[string]any
	// The array first; the line on stderr that says why the exit is 1 after.
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&sts); err != nil || code != 1 || len(sts) != 1 ||
		!strings.Contains(out, "1 dead letters waiting") {
		t.Fatalf("inbox status --json: exit %d (want 1: a dead letter waits), %v\n%s", code, err, out)
	}
	st := sts[0]
	if st["consumer"] != "billing" || st["last_message_id"] != "m4" || st["last_processed_at"] == nil ||
		st["dead_letters"] != 1.0 || st["parked_aggregates"] != 1.0 || st["parked_messages"] != 2.0 {
		t.Errorf("inbox status --json = %v", st)
	}
	if out, _ := e.cli("inbox", "status", "--database-url", e.dbURL); !strings.Contains(out, "billing") || !strings.Contains(out, "m4") {
		t.Errorf("inbox status table:\n%s", out)
	}

	s, err := in.Status(ctx)
	if err != nil || len(s.Parked) != 1 {
		t.Fatalf("status %+v, %v", s, err)
	}
	if _, err := in.Replay(ctx, s.Parked[0].DeadLetterID, h); err != nil {
		t.Fatal(err)
	}
	if out, code := e.cli("inbox", "status", "--database-url", e.dbURL, "--json"); code != 0 || !strings.Contains(out, `"dead_letters": 0`) {
		t.Errorf("inbox status after the replay: exit %d, want 0\n%s", code, out)
	}
}
