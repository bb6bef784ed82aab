package integration

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strconv"
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

// TestInboxDLQCommands: `inbox dlq list|show|replay|discard` on a consumer
// database. list and show read the dead letters and their chains; replay
// and discard record the operator's request and run nothing (the handler
// lives in the consumer); the consumer's ReplayRequested (what its runner
// calls) then runs exactly the requested messages, in order, once. Every
// bad input is one error with exit 2 that changes nothing.
func TestInboxDLQCommands(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if out, code := e.cli("migrate", "--inbox", "--database-url", e.dbURL); code != 0 {
		t.Fatalf("migrate --inbox: exit %d\n%s", code, out)
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
	failing := map[string]bool{"m1": true, "m5": true, "m7": true}
	var ran []string // the handler's effects, in order
	h := func(_ context.Context, _ pgx.Tx, m inbox.Message) error {
		if failing[m.ID] {
			return errors.New("card declined")
		}
		ran = append(ran, m.ID)
		return nil
	}
	process := func(id, agg string, want inbox.Outcome) {
		t.Helper()
		m := inbox.Message{ID: id, AggregateType: "order", AggregateID: agg, EventType: "paid", Payload: []byte(`{"n":1}`)}
		if res, err := in.Process(ctx, m, h); err != nil || res.Outcome != want {
			t.Fatalf("%s: %+v, %v; want %v", id, res, err, want)
		}
	}
	process("m1", "7", inbox.DeadLettered) // letter a: replayed, with m2 and m3 behind it
	process("m2", "7", inbox.Parked)
	process("m3", "7", inbox.Parked)
	process("m5", "9", inbox.DeadLettered) // letter b: discarded, m6 behind it
	process("m6", "9", inbox.Parked)
	if res, err := in.Receive(ctx, inbox.Raw{Value: []byte("not an envelope")}, h); err != nil || res.Outcome != inbox.DeadLettered {
		t.Fatalf("undecodable: %+v, %v", res, err) // letter c: dead, discarded at once
	}
	process("m7", "11", inbox.DeadLettered) // letter d: its requested replay fails
	ran = nil

	var letters []inbox.DeadLetter
	out, code := e.cli("inbox", "dlq", "list", "--database-url", e.dbURL, "--json")
	if err := json.Unmarshal([]byte(out), &letters); err != nil || code != 0 || len(letters) != 4 {
		t.Fatalf("inbox dlq list --json: exit %d, %v\n%s", code, err, out)
	}
	a, b, c, d := letters[0], letters[1], letters[2], letters[3]
	if a.MessageID != "m1" || len(a.Parked) != 2 || a.Parked[0].MessageID != "m2" || a.Parked[1].MessageID != "m3" ||
		b.MessageID != "m5" || len(b.Parked) != 1 || c.State != "dead" || d.MessageID != "m7" || a.Consumer != "billing" {
		t.Fatalf("inbox dlq list --json = %+v", letters)
	}
	id := func(l inbox.DeadLetter) string { return strconv.FormatInt(l.ID, 10) }
	if out, code := e.cli("inbox", "dlq", "list", "--database-url", e.dbURL); code != 0 ||
		!strings.Contains(out, "CONSUMER") || !strings.Contains(out, "order/7") || !strings.Contains(out, "card declined") {
		t.Errorf("inbox dlq list: exit %d\n%s", code, out)
	}
	out, code = e.cli("inbox", "dlq", "show", "--database-url", e.dbURL, "--id", id(a))
	if code != 0 || !regexp.MustCompile(`message id +m1\n`).MatchString(out) || !strings.Contains(out, `"n": 1`) ||
		!strings.Contains(out, "parked behind it: 2 message(s) of order/7") || strings.Index(out, "message m2") > strings.Index(out, "message m3") {
		t.Errorf("inbox dlq show --id %d: exit %d\n%s", a.ID, code, out)
	}

	// Bad input: one error, exit 2, naming the fix; nothing changes.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "--id", "999999"}, "no dead letter 999999"},
		{[]string{"replay", "--id", "999999"}, "no dead letter 999999"},
		{[]string{"list", "--consumer", "shipping"}, `consumer "shipping" has no processed records or dead letters`},
		{[]string{"replay", "--id", id(a), "--consumer", "shipping"}, `consumer "shipping"`},
		{[]string{"discard", "--id", id(b)}, "needs --reason"},
		{[]string{"replay"}, "needs --id"},
		{[]string{"purge"}, `unknown inbox dlq subcommand "purge"`},
		{[]string{"list", "--schema", "nosuch"}, "migrate --inbox"},
	} {
		out, code := e.cli(append([]string{"inbox", "dlq", tc.args[0], "--database-url", e.dbURL}, tc.args[1:]...)...)
		if code != 2 || !strings.Contains(out, tc.want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("inbox dlq %v: exit %d, want 2 and one line with %q\n%s", tc.args, code, tc.want, out)
		}
	}

	// replay records the request; nothing runs until the consumer does.
	out, code = e.cli("inbox", "dlq", "replay", "--database-url", e.dbURL, "--id", id(a))
	if code != 0 || !strings.Contains(out, "requested the replay of dead letter "+id(a)+" of consumer billing") || !strings.Contains(out, "nothing has run yet") {
		t.Fatalf("inbox dlq replay: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{{"replay", "--id", id(a)}, {"discard", "--id", id(a), "--reason", "x"}} {
		if out, code := e.cli(append([]string{"inbox", "dlq", args[0], "--database-url", e.dbURL}, args[1:]...)...); code != 2 || !strings.Contains(out, "waits for the consumer's runner") {
			t.Errorf("inbox dlq %v of a pending replay: exit %d, want 2\n%s", args, code, out)
		}
	}
	// discard: without a chain, released at once; with one, the chain waits.
	out, code = e.cli("inbox", "dlq", "discard", "--database-url", e.dbURL, "--id", id(c), "--reason", "not ours")
	if code != 0 || !strings.Contains(out, "the letter is released") || !strings.Contains(out, "cli: ") {
		t.Errorf("inbox dlq discard of a dead letter without a chain: exit %d\n%s", code, out)
	}
	out, code = e.cli("inbox", "dlq", "discard", "--database-url", e.dbURL, "--id", id(b), "--reason", "refunded by hand", "--consumer", "billing")
	if code != 0 || !strings.Contains(out, "runs the 1 message(s) parked behind it") {
		t.Errorf("inbox dlq discard with a chain: exit %d\n%s", code, out)
	}
	if out, code := e.cli("inbox", "dlq", "replay", "--database-url", e.dbURL, "--id", id(d)); code != 0 {
		t.Fatalf("inbox dlq replay of d: exit %d\n%s", code, out)
	}
	if len(ran) != 0 {
		t.Fatalf("the CLI ran the handler: %v", ran)
	}

	// The consumer's side: its runner's ReplayRequested runs the requests.
	failing["m1"] = false
	res, err := in.ReplayRequested(ctx, h)
	if err == nil || !strings.Contains(err.Error(), "dead letter "+id(d)+" stopped") || res.Processed != 4 || res.Duplicates != 0 {
		t.Fatalf("ReplayRequested: %+v, %v; want 4 processed and the failure of %d", res, err, d.ID)
	}
	if want := []string{"m1", "m2", "m3", "m6"}; !slices.Equal(ran, want) {
		t.Fatalf("the handler ran %v, want %v (m5 discarded, m7 failing)", ran, want)
	}
	if res, err := in.ReplayRequested(ctx, h); err != nil || res.Processed != 0 {
		t.Errorf("a second ReplayRequested: %+v, %v; want nothing run", res, err)
	}
	out, code = e.cli("inbox", "dlq", "show", "--database-url", e.dbURL, "--id", id(d))
	if code != 0 || !strings.Contains(out, "the last requested replay failed") || !strings.Contains(out, "card declined") {
		t.Errorf("inbox dlq show of a failed replay: exit %d\n%s", code, out)
	}
	if out, code := e.cli("inbox", "dlq", "replay", "--database-url", e.dbURL, "--id", id(a)); code != 2 || !strings.Contains(out, "was replayed and released") {
		t.Errorf("inbox dlq replay of a replayed letter: exit %d, want 2\n%s", code, out)
	}
	if out, code := e.cli("inbox", "dlq", "discard", "--database-url", e.dbURL, "--id", id(c), "--reason", "again"); code != 2 || !strings.Contains(out, "was discarded and released") {
		t.Errorf("inbox dlq discard of a discarded letter: exit %d, want 2\n%s", code, out)
	}
	out, code = e.cli("inbox", "dlq", "list", "--database-url", e.dbURL, "--all", "--json")
	letters = nil
	if err := json.Unmarshal([]byte(out), &letters); err != nil || code != 0 || len(letters) != 4 {
		t.Fatalf("inbox dlq list --all --json: exit %d, %v\n%s", code, err, out)
	}
	for i, want := range []string{"released", "released", "released", "parked"} {
		if letters[i].State != want {
			t.Errorf("letter %d (%s): state %s, want %s", letters[i].ID, letters[i].MessageID, letters[i].State, want)
		}
	}
	if l := letters[1]; l.DiscardReason != "refunded by hand" || !strings.HasPrefix(l.DiscardedBy, "cli: ") || l.DiscardedAt == nil {
		t.Errorf("the discard of b is not recorded: %+v", l)
	}
	if l := letters[0]; !strings.HasPrefix(l.ReplayRequestedBy, "cli: ") || l.ReplayRequestedAt == nil {
		t.Errorf("the replay request of a is not recorded: %+v", l)
	}
	// Only d waits: status says so.
	if out, code := e.cli("inbox", "status", "--database-url", e.dbURL, "--json"); code != 1 || !strings.Contains(out, `"dead_letters": 1`) {
		t.Errorf("inbox status: exit %d, want 1 with one dead letter\n%s", code, out)
	}
}
