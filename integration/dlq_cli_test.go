package integration

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// deadMessage is a message as the relay hands it to the dead-letter store.
func deadMessage(aggID, eventType string, lsn pglogrepl.LSN) *relay.Message {
	id := newUUID()
	body := fmt.Sprintf(`{"envelope_version":1,"message_id":%q,"event_type":%q,"aggregate_type":"order","aggregate_id":%q,"payload":{"n":%d}}`,
		id, eventType, aggID, lsn)
	return &relay.Message{ID: id, AggregateType: "order", AggregateID: aggID, EventType: eventType, Table: "public.outbox",
		Envelope: []byte(body), Destination: "outbox.order", Attempts: 3, LastError: errors.New("MESSAGE_TOO_LARGE"),
		CommitLSN: lsn, LSN: lsn, CommitTime: time.Now()}
}

// seedDeadLetters stores a plain dead letter for slot orders and, for slot
// billing, a head with two messages parked behind it. It returns the
// billing head's message and its chain in order.
func (e *env) seedDeadLetters() (plain, head *relay.Message, chain []*relay.Message) {
	e.t.Helper()
	ctx := e.t.Context()
	orders := &store.DeadLetters{DB: e.db, Slot: "orders"}
	billing := &store.DeadLetters{DB: e.db, Slot: "billing"}
	plain = deadMessage("1", "order.created", 0x100)
	if err := orders.Add(ctx, plain); err != nil {
		e.t.Fatal(err)
	}
	head = deadMessage("7", "order.created", 0x200)
	if err := billing.AddHead(ctx, head); err != nil {
		e.t.Fatal(err)
	}
	for i, ev := range []string{"order.paid", "order.shipped"} {
		m := deadMessage("7", ev, pglogrepl.LSN(0x300+i))
		if parked, err := billing.Park(ctx, m); err != nil || !parked {
			e.t.Fatalf("park %s: parked %v, %v", ev, parked, err)
		}
		chain = append(chain, m)
	}
	return plain, head, chain
}

// dlqCounts is what outboxrelay keeps of dead letters: pending letters,
// replayed ones and parked messages.
func (e *env) dlqCounts() string {
	e.t.Helper()
	var pending, replayed, parked int
	err := e.db.QueryRow(e.t.Context(), `SELECT
		(SELECT count(*) FROM outboxrelay.dead_letters WHERE replayed_at IS NULL),
		(SELECT count(*) FROM outboxrelay.dead_letters WHERE replayed_at IS NOT NULL),
		(SELECT count(*) FROM outboxrelay.parked)`).Scan(&pending, &replayed, &parked)
	if err != nil {
		e.t.Fatal(err)
	}
	return fmt.Sprintf("pending=%d replayed=%d parked=%d", pending, replayed, parked)
}

// Without --slot, dlq list and purge cover every slot and say which slot
// each letter is of; dlq show pretty-prints one with its chain; dlq replay
// --dry-run prints the publishing order and changes nothing.
func TestDeadLetterCommandsAcrossSlots(t *testing.T) {
	e := newEnv(t)
	plain, head, chain := e.seedDeadLetters()

	out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
	if code != 0 {
		t.Fatalf("dlq list exit %d: %s", code, out)
	}
	var letters []struct {
		ID        int64  `json:"id"`
		Slot      string `json:"slot"`
		MessageID string `json:"message_id"`
	}
	if err := json.Unmarshal([]byte(out), &letters); err != nil {
		t.Fatalf("dlq list --json: %v\n%s", err, out)
	}
	slots := map[string]string{}
	var headID int64
	for _, l := range letters {
		slots[l.MessageID] = l.Slot
		if l.MessageID == head.ID {
			headID = l.ID
		}
	}
	if len(letters) != 2 || slots[plain.ID] != "orders" || slots[head.ID] != "billing" {
		t.Fatalf("dlq list without --slot = %s, want the letter of slot orders and the one of slot billing", out)
	}
	out, _ = e.cli("dlq", "list", "--database-url", e.dbURL)
	if !strings.Contains(out, "SLOT") || !strings.Contains(out, "orders") || !strings.Contains(out, "billing") {
		t.Fatalf("dlq list does not show the slots:\n%s", out)
	}
	t.Logf("dlq list:\n%s", out)
	out, _ = e.cli("dlq", "list", "--database-url", e.dbURL, "--slot", "orders")
	if !strings.Contains(out, plain.ID) || strings.Contains(out, head.ID) {
		t.Fatalf("dlq list --slot orders:\n%s", out)
	}

	out, code = e.cli("dlq", "show", "--database-url", e.dbURL, "--id", fmt.Sprint(headID))
	if code != 0 {
		t.Fatalf("dlq show exit %d: %s", code, out)
	}
	t.Logf("dlq show:\n%s", out)
	want := []string{"slot", "billing", "MESSAGE_TOO_LARGE", `    "message_id": "` + head.ID + `"`,
		"parked behind it: 2 message(s) of order/7", "1. message " + chain[0].ID, `       "n": 768`, "2. message " + chain[1].ID}
	at := 0
	for _, w := range want {
		i := strings.Index(out[at:], w)
		if i < 0 {
			t.Fatalf("dlq show does not say %q (after position %d):\n%s", w, at, out)
		}
		at += i
	}
	if out, code := e.cli("dlq", "show", "--database-url", e.dbURL, "--id", "999999"); code != 2 || !strings.Contains(out, "no dead letter with id 999999") {
		t.Fatalf("dlq show of a missing id: exit %d: %s", code, out)
	}

	before := e.dlqCounts()
	cfg := e.writeConfig(strings.Replace(e.configText(), "  status_interval: 200ms\n", "  status_interval: 200ms\n  slot: billing\n", 1))
	out, code = e.cli("dlq", "replay", "--config", cfg, "--all", "--dry-run")
	if code != 0 {
		t.Fatalf("dlq replay --dry-run exit %d: %s", code, out)
	}
	t.Logf("dlq replay --dry-run:\n%s", out)
	at = 0
	for _, id := range []string{head.ID, chain[0].ID, chain[1].ID} {
		i := strings.Index(out[at:], id)
		if i < 0 {
			t.Fatalf("dry run does not list %s in order:\n%s", id, out)
		}
		at += i
	}
	if strings.Contains(out, plain.ID) {
		t.Fatalf("dry run with the config of slot billing lists the letter of slot orders:\n%s", out)
	}
	if after := e.dlqCounts(); after != before {
		t.Fatalf("dry run changed the dead letters: %s, was %s", after, before)
	}
	var steps []json.RawMessage
	out, _ = e.cli("dlq", "replay", "--database-url", e.dbURL, "--all", "--dry-run", "--json")
	if err := json.Unmarshal([]byte(out), &steps); err != nil || len(steps) != 4 {
		t.Fatalf("dry run --json over every slot: %v\n%s", err, out)
	}

	out, code = e.cli("dlq", "purge", "--database-url", e.dbURL, "--before", "0s")
	if code != 0 || !strings.Contains(out, "purged 2 dead letter(s) of every slot") || !strings.Contains(out, "and 2 message(s) parked") {
		t.Fatalf("dlq purge without --slot: exit %d: %s", code, out)
	}
	if after := e.dlqCounts(); after != "pending=0 replayed=0 parked=0" {
		t.Fatalf("after purge: %s", after)
	}
}

// dlq replay --all draws a progress bar on a terminal, and on nothing else.
func TestDeadLetterReplayProgress(t *testing.T) {
	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) is not installed: no terminal to test on")
	}
	e := newEnv(t)
	_, head, chain := e.seedDeadLetters()
	cfg := e.writeConfig(strings.Replace(e.configText(), "  status_interval: 200ms\n", "  status_interval: 200ms\n  slot: billing\n", 1))
	c := e.consume("outbox.order")

	// Not a terminal: the output is a pipe.
	out, code := e.cli("dlq", "replay", "--config", cfg, "--all")
	if code != 0 || !strings.Contains(out, "replayed 1 dead letter(s) and 2 parked message(s)") {
		t.Fatalf("dlq replay --all exit %d: %s", code, out)
	}
	if strings.Contains(out, "replaying") || strings.Contains(out, "\r") {
		t.Fatalf("dlq replay --all drew a progress bar into a pipe:\n%q", out)
	}
	recs := c.waitIDs([]string{head.ID, chain[0].ID, chain[1].ID}, 30*time.Second)
	var order []string
	for _, r := range recs {
		order = append(order, r.Headers["message_id"])
	}
	if strings.Join(order, ",") != strings.Join([]string{head.ID, chain[0].ID, chain[1].ID}, ",") {
		t.Fatalf("replayed in order %v, want the head then its chain", order)
	}

	// A terminal: script(1) runs the command on a pseudo-terminal.
	orders := &store.DeadLetters{DB: e.db, Slot: "billing"}
	for _, ev := range []string{"order.created", "order.paid"} {
		if err := orders.Add(t.Context(), deadMessage("8", ev, 0x400)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(t.Context(), script, "-qec", fmt.Sprintf("%s dlq replay --config %s --all", relayBin, cfg), "/dev/null")
	cmd.Env = cleanEnv()
	tty, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dlq replay --all on a terminal: %v\n%s", err, tty)
	}
	if !strings.Contains(string(tty), "\rreplaying [") || !strings.Contains(string(tty), "2/2 100%") {
		t.Fatalf("dlq replay --all on a terminal drew no progress bar:\n%q", tty)
	}
}
