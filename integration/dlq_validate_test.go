package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A replayed dead letter is checked as the relay checks a row (issue 42,
// item 4): a row with an empty event_type, dead-lettered as invalid, is
// refused by `dlq replay` and by the management API (and so the console)
// with the reason, and published only when an operator forces it, which
// the letter records.

// insertEmptyEventType commits a row of aggregate order/9 whose
// event_type is empty and returns its id.
func (e *env) insertEmptyEventType() string {
	e.t.Helper()
	var id string
	if err := e.db.QueryRow(e.t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '9', '', '{"n": 1}') RETURNING id::text`).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// deadLetterID waits for the dead letter of message id and returns its id.
func (e *env) deadLetterID(messageID string, timeout time.Duration) int64 {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var id int64
		err := e.db.QueryRow(e.t.Context(), `SELECT id FROM outboxrelay.dead_letters WHERE message_id = $1`, messageID).Scan(&id)
		if err == nil {
			return id
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no dead letter for %s within %s: %v", messageID, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replayRecord is what the letter row says of its replay.
func (e *env) replayRecord(id int64) (replayed bool, forcedBy string) {
	e.t.Helper()
	if err := e.db.QueryRow(e.t.Context(), `SELECT replayed_at IS NOT NULL, coalesce(replay_forced_by, '') FROM outboxrelay.dead_letters WHERE id = $1`, id).Scan(&replayed, &forcedBy); err != nil {
		e.t.Fatal(err)
	}
	return replayed, forcedBy
}

// published returns the records of c with message id, after giving a
// publish that was made a second to arrive.
func published(c *consumer, id string) []record {
	time.Sleep(time.Second)
	var out []record
	for _, r := range c.records() {
		if r.Headers["message_id"] == id {
			out = append(out, r)
		}
	}
	return out
}

// TestDeadLetterReplayRefusesInvalidCLI: dlq replay --dry-run says it
// would refuse the invalid letter; dlq replay --id and --all refuse it (exit 1, the reason, the way to force it), publish
// nothing of it and leave it pending, while --all still replays a valid
// letter; --force publishes it and records who forced it.
func TestDeadLetterReplayRefusesInvalidCLI(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	valid := e.insert("public.outbox", "order", "1", 5)
	invalid := e.insertEmptyEventType()
	// A row the relay refuses for what the letter does not show: its
	// routing fields are all there, its headers are not an object.
	var badHeaders string
	if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', '8', 'order.created', '{"n": 2}', '[1, 2]') RETURNING id::text`).Scan(&badHeaders); err != nil {
		t.Fatal(err)
	}
	c.waitIDs(valid, 30*time.Second)
	id := e.deadLetterID(invalid, 30*time.Second)
	badID := e.deadLetterID(badHeaders, 30*time.Second)
	p.stop()
	// A letter the broker refused, for --all to replay beside the invalid one.
	refused := deadMessage("2", "order.created", 0x100)
	e.exec(`INSERT INTO outboxrelay.dead_letters (slot, message_id, destination, aggregate_type, aggregate_id, event_type, source_table,
		traceparent, headers, envelope, body, error, attempts, first_failed_at, last_failed_at)
		VALUES ('outboxrelay', $1, 'outbox.order', 'order', '2', 'order.created', 'public.outbox', '', '{}', $2, $3, 'MESSAGE_TOO_LARGE', 3, now(), now())`,
		refused.ID, string(refused.Envelope), refused.Envelope)
	cfg := e.config()

	out, code := e.cli("dlq", "replay", "--config", cfg, "--all", "--dry-run")
	t.Logf("dlq replay --all --dry-run: exit %d\n%s", code, out)
	if want := fmt.Sprintf("dead letter %d is not a valid outbox message (column event_type is null or empty): refused without --force", id); code != 0 || !strings.Contains(out, want) {
		t.Errorf("dlq replay --dry-run: exit %d; want exit 0 and %q", code, want)
	}
	out, code = e.cli("dlq", "replay", "--config", cfg, "--id", fmt.Sprint(id))
	t.Logf("dlq replay --id %d: exit %d\n%s", id, code, out)
	if code != 1 || !strings.Contains(out, "column event_type is null or empty") || !strings.Contains(out, "--force") ||
		!strings.Contains(out, "replayed 0 dead letter(s)") {
		t.Errorf("dlq replay of the invalid letter: exit %d; want exit 1, the reason and how to force it", code)
	}
	out, code = e.cli("dlq", "replay", "--config", cfg, "--all")
	t.Logf("dlq replay --all: exit %d\n%s", code, out)
	if code != 1 || !strings.Contains(out, "replayed 1 dead letter(s)") || !strings.Contains(out, "column event_type is null or empty") ||
		!strings.Contains(out, fmt.Sprintf("dead letter %d", badID)) || !strings.Contains(out, "headers must be a JSON object") {
		t.Errorf("dlq replay --all: exit %d; want exit 1, the valid letter replayed and both invalid ones refused with their reasons", code)
	}
	if got := published(c, invalid); len(got) != 0 {
		t.Fatalf("the invalid letter was published %d times without --force: event_type %q", len(got), got[0].Env["event_type"])
	}
	if got := published(c, badHeaders); len(got) != 0 {
		t.Fatalf("the letter with headers that are not an object was published %d times without --force", len(got))
	}
	if replayed, _ := e.replayRecord(id); replayed {
		t.Fatal("the refused letter is marked replayed")
	}
	if len(published(c, refused.ID)) != 1 {
		t.Errorf("the valid letter was not replayed once by --all")
	}

	out, code = e.cli("dlq", "replay", "--config", cfg, "--id", fmt.Sprint(id), "--force")
	t.Logf("dlq replay --force: exit %d\n%s", code, out)
	replayed, forcedBy := e.replayRecord(id)
	if code != 0 || !strings.Contains(out, "forced 1 letter(s)") || !replayed || !strings.HasPrefix(forcedBy, "cli: ") {
		t.Fatalf("dlq replay --force: exit %d, replayed %v, forced by %q; want exit 0, replayed and forced by the cli's user", code, replayed, forcedBy)
	}
	got := published(c, invalid)
	if len(got) != 1 || got[0].Env["event_type"] != "" {
		t.Errorf("forced replay published %d records of the letter, want 1 as it is", len(got))
	}
	if out, _ := e.cli("dlq", "show", "--database-url", e.dbURL, "--id", fmt.Sprint(id)); !strings.Contains(out, "forced by "+forcedBy) {
		t.Errorf("dlq show does not say who forced the replay:\n%s", out)
	}
	if replayed, _ := e.replayRecord(badID); replayed {
		t.Error("the letter with bad headers, not forced, is marked replayed")
	}
	t.Logf("ledger: 5 valid rows delivered, 2 invalid rows dead-lettered; replays without --force published them 0 times, --force --id the empty event_type once (forced by %s)", forcedBy)
}

// TestDeadLetterReplayRefusesInvalidAPI: the management API's replay (the
// console's) answers 422 with the reason and publishes nothing; with
// ?force=true it publishes the letter, which records the actor, and the
// audit line shows the force.
func TestDeadLetterReplayRefusesInvalidAPI(t *testing.T) {
	e := newEnvWith(t, serverFor(t), "", "--slot", "billing")
	token := filepath.Join(t.TempDir(), "action-token")
	if err := os.WriteFile(token, []byte("act-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := e.consume("outbox.order")
	p := e.startConfig(fmt.Sprintf(`http:
  listen: 127.0.0.1:0
  action_token_file: %s
pipelines:
  - name: billing
    postgres:
      url: %s
      slot: billing
    sink:
      kafka:
        brokers: [%s]
`, token, e.dbURL, e.brokers))
	waitReady(t, "http://"+p.httpAddr()+"/readyz", 200, 30*time.Second)
	valid := e.insert("public.outbox", "order", "1", 5)
	invalid := e.insertEmptyEventType()
	c.waitIDs(valid, 30*time.Second)
	id := e.deadLetterID(invalid, 30*time.Second)

	post := func(url string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer act-secret")
		req.Header.Set("X-Actor", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	replay := fmt.Sprintf("http://%s/api/v1/pipelines/billing/dead-letters/%d/replay", p.httpAddr(), id)
	code, body := post(replay)
	t.Logf("replay: %d %s", code, body)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "column event_type is null or empty") || !strings.Contains(body, "force=true") {
		t.Errorf("replay of the invalid letter: %d; want 422 with the reason and how to force it", code)
	}
	if got := published(c, invalid); len(got) != 0 {
		t.Fatalf("the invalid letter was published %d times without force: event_type %q", len(got), got[0].Env["event_type"])
	}
	if replayed, _ := e.replayRecord(id); replayed {
		t.Fatal("the refused letter is marked replayed")
	}

	code, body = post(replay + "?force=true")
	t.Logf("replay?force=true: %d %s", code, body)
	replayed, forcedBy := e.replayRecord(id)
	if code != 200 || !strings.Contains(body, `"forced":true`) || !replayed || !strings.Contains(forcedBy, `"alice"`) {
		t.Fatalf("forced replay: %d %s, replayed %v, forced by %q; want 200, replayed, forced by alice", code, body, replayed, forcedBy)
	}
	if got := published(c, invalid); len(got) != 1 {
		t.Errorf("forced replay published %d records of the letter, want 1", len(got))
	}
	p.stop()
	log := p.out.String()
	if !strings.Contains(log, `"query":"force=true"`) || !strings.Contains(log, `"forced_by":"api: actor \"alice\"`) {
		t.Errorf("the log does not show the forced replay (audit query force=true, forced_by alice):\n%s", tail(log, 20))
	}
	t.Logf("ledger: 5 valid rows delivered; the invalid letter refused (422) and published 0 times, then forced once by %s", forcedBy)
}
