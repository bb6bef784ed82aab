package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// insertEvents writes n rows of one aggregate and event type in one
// transaction and returns their ids.
func (e *env) insertEvents(aggID, eventType string, n int) []string {
	e.t.Helper()
	rows, err := e.db.Query(e.t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', $1, $2, jsonb_build_object('seq', g) FROM generate_series(1, $3) g RETURNING id::text`, aggID, eventType, n)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// parkedLetter is a dead letter as `dlq list --json` shows it.
type parkedLetter struct {
	ID        int64  `json:"id"`
	MessageID string `json:"message_id"`
	Parks     bool   `json:"parks"`
	Parked    []struct {
		MessageID string `json:"message_id"`
	} `json:"parked"`
}

// dlqList returns `dlq list --json`.
func (e *env) dlqList() []parkedLetter {
	e.t.Helper()
	out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
	if code != 0 {
		e.t.Fatalf("dlq list exit %d: %s", code, out)
	}
	var letters []parkedLetter
	if err := json.Unmarshal([]byte(out), &letters); err != nil {
		e.t.Fatalf("dlq list --json: %v\n%s", err, out)
	}
	return letters
}

// waitParked waits until the one dead letter parks exactly want messages.
func (e *env) waitParked(want []string) parkedLetter {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var letters []parkedLetter
	for time.Now().Before(deadline) {
		letters = e.dlqList()
		if len(letters) == 1 && len(letters[0].Parked) == len(want) {
			for i, p := range letters[0].Parked {
				if p.MessageID != want[i] {
					e.t.Fatalf("parked chain position %d is %s, want %s (commit order)", i+1, p.MessageID, want[i])
				}
			}
			return letters[0]
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatalf("want one dead letter parking %d messages, have %+v", len(want), letters)
	return parkedLetter{}
}

// TestDeadLetterParksAggregate: a message of aggregate order/7 that Kafka
// refuses for good (its topic name is illegal) is dead-lettered, and the
// aggregate's later messages, committed before and after the dead letter,
// and after a restart of the relay, are parked behind it instead of
// published, while other aggregates flow on. `dlq replay` of the head, run
// while the relay runs, publishes the head and its chain in commit order,
// and the aggregate's next message, which the relay publishes itself,
// arrives after them. Checked against the ledger: nothing lost, and within
// each aggregate the first copy of every row arrives in commit order.
func TestDeadLetterParksAggregate(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order.created")
	relayEnv := []string{"OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2", "OUTBOXRELAY_SINK_KAFKA_TOPIC=outbox.{event_type}"}
	p := e.start(relayEnv...)
	p.waitLog(`"streaming"`, 30*time.Second)

	// The ledger, in commit order (one writer).
	var mu sync.Mutex
	var ledger []committedTx
	write := func(agg, eventType string, n int) []string {
		ids := e.insertEvents(agg, eventType, n)
		mu.Lock()
		ledger = append(ledger, committedTx{agg, ids})
		mu.Unlock()
		return ids
	}
	first7 := write("7", "order.created", 2)
	poison := write("7", "bad topic", 1)[0]
	parked := write("7", "order.created", 3)
	others := write("1", "order.created", 3)
	others = append(others, write("8", "order.created", 3)...)
	parked = append(parked, write("7", "order.created", 2)...)
	c.waitIDs(append(first7, others...), 60*time.Second)
	// The other aggregates' rows, committed after most of the parked ones,
	// have arrived: so would the parked ones, were they published.
	time.Sleep(time.Second)
	notArrived(t, c, append([]string{poison}, parked...))
	head := e.waitParked(parked)
	if head.MessageID != poison || !head.Parks {
		t.Fatalf("dead letter %+v, want the poison message %s heading its aggregate", head, poison)
	}

	// Parked survives a restart: the relay reads the parked aggregates
	// before it streams.
	p.stop()
	p = e.start(relayEnv...)
	p.waitLog(`"streaming"`, 30*time.Second)
	parked = append(parked, write("7", "order.created", 2)...)
	more := write("1", "order.created", 2)
	others = append(others, more...)
	c.waitIDs(more, 60*time.Second)
	e.waitParked(parked)
	notArrived(t, c, append([]string{poison}, parked...))
	out, _ := e.cli("dlq", "list", "--database-url", e.dbURL)
	if !strings.Contains(out, "BEHIND") || !strings.Contains(out, "order/7") {
		t.Fatalf("dlq list does not show what is parked behind what:\n%s", out)
	}
	t.Logf("dlq list:\n%s", out)

	// Fix the cause (route to a legal topic) and replay the head while the
	// relay runs, and while rows of aggregate 7 keep being committed: each
	// is parked and published in the chain, or, once the replay released
	// the aggregate, published by the relay behind the chain.
	writing := make(chan struct{})
	var during []string
	go func() {
		defer close(writing)
		for i := 0; i < 40; i++ {
			ids := e.insertRetry("outbox", "order", "7", 1)
			mu.Lock()
			ledger = append(ledger, committedTx{"7", ids})
			during = append(during, ids...)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	cfg := e.config()
	out, code := e.cliEnv([]string{"OUTBOXRELAY_SINK_KAFKA_TOPIC=outbox.order.created"}, "dlq", "replay", "--config", cfg, "--id", fmt.Sprint(head.ID))
	var replayedLetters, replayedParked int
	if _, err := fmt.Sscanf(out[max(strings.Index(out, "replayed "), 0):], "replayed %d dead letter(s) and %d parked message(s)", &replayedLetters, &replayedParked); code != 0 || err != nil ||
		replayedLetters != 1 || replayedParked < len(parked) {
		t.Fatalf("dlq replay exit %d, want 1 dead letter and at least %d parked messages replayed: %s", code, len(parked), out)
	}
	<-writing
	// The aggregate is released: its next message goes out at once, behind
	// the chain.
	after := write("7", "order.created", 2)

	var ids []string
	for _, tx := range ledger {
		ids = append(ids, tx.ids...)
	}
	recs := c.waitIDs(ids, 60*time.Second)
	p.stop()
	if letters := e.dlqList(); len(letters) != 0 {
		t.Fatalf("after replay, dlq list shows %+v", letters)
	}

	pos := map[string]int{}
	aggOf := map[string]string{}
	for _, tx := range ledger {
		for _, id := range tx.ids {
			pos[id] = len(pos)
			aggOf[id] = tx.agg
		}
	}
	seen := map[string]bool{}
	last := map[string]string{}
	disorders := 0
	for _, r := range recs {
		id := r.Headers["message_id"]
		if seen[id] {
			continue
		}
		seen[id] = true
		if prev, ok := last[r.Key]; ok && pos[prev] > pos[id] {
			disorders++
			t.Errorf("aggregate %s: first delivery of row %s after row %s, committed later", r.Key, id, prev)
		}
		last[r.Key] = id
		if r.Key != aggOf[id] {
			t.Errorf("row %s of aggregate %s has key %q", id, aggOf[id], r.Key)
		}
	}
	t.Logf("dead letter parks its aggregate: rows %d (aggregate 7: %d before the dead letter, 1 dead letter, %d parked, %d committed during the replay of which %d were replayed from the chain, %d after it; other aggregates %d), lost 0, out of order %d, duplicates %d",
		len(ids), len(first7), len(parked), len(during), replayedParked-len(parked), len(after), len(others), disorders, duplicates(recs))
}

// notArrived fails the test if one of ids was consumed.
func notArrived(t *testing.T, c *consumer, ids []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	for _, r := range c.records() {
		if want[r.Headers["message_id"]] {
			n++
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d messages of aggregate 7 behind its dead letter arrived before the dead letter was replayed", n, len(ids))
	}
}

// TestDeadLetterPassMode: with relay.dead_letter_order: pass, the later
// messages of a dead letter's aggregate are published as before, and
// nothing is parked.
func TestDeadLetterPassMode(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order.created")
	p := e.start("OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2", "OUTBOXRELAY_SINK_KAFKA_TOPIC=outbox.{event_type}", "OUTBOXRELAY_RELAY_DEAD_LETTER_ORDER=pass")
	p.waitLog(`"streaming"`, 30*time.Second)
	poison := e.insertEvents("7", "bad topic", 1)[0]
	later := e.insertEvents("7", "order.created", 3)
	c.waitIDs(later, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	var letters []parkedLetter
	for time.Now().Before(deadline) {
		if letters = e.dlqList(); len(letters) == 1 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.stop()
	if len(letters) != 1 || letters[0].MessageID != poison || letters[0].Parks || len(letters[0].Parked) != 0 {
		t.Fatalf("pass mode: dead letters %+v, want only %s, parking nothing", letters, poison)
	}
}
