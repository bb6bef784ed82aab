package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

// Row content stays inside its message: a row cannot address the relay's
// own destinations, and a destination or header that is not valid UTF-8
// dead-letters its row instead of stopping the relay (issue 28, items 1
// and 2).

// lostAfter waits up to timeout for every id of ids to reach c and returns
// how many did not.
func lostAfter(c *consumer, ids []string, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, r := range c.records() {
			seen[r.Headers["message_id"]] = true
		}
		lost := 0
		for _, id := range ids {
			if !seen[id] {
				lost++
			}
		}
		if lost == 0 || time.Now().After(deadline) {
			return lost
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deadLetterError returns the error stored with id's dead letter, waiting
// up to timeout for it; "" when there is none.
func (e *env) deadLetterError(id string, timeout time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var msg string
		err := e.db.QueryRow(e.t.Context(), "SELECT error FROM outboxrelay.dead_letters WHERE message_id = $1", id).Scan(&msg)
		if err == nil {
			return msg
		}
		if err != pgx.ErrNoRows {
			e.t.Fatalf("read dead letter %s: %v", id, err)
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// operatorView is what an operator sees: the exit code of outboxrelay
// status and the relay's /readyz.
func (e *env) operatorView(p *proc) string {
	e.t.Helper()
	_, code := e.cli("status", "--database-url", e.dbURL)
	resp, err := http.Get("http://" + p.httpAddr() + "/readyz")
	if err != nil {
		e.t.Fatalf("GET /readyz: %v", err)
	}
	resp.Body.Close()
	return fmt.Sprintf("status exit %d, /readyz %d", code, resp.StatusCode)
}

// TestExactlyOnceRowCannotWritePosition: with exactly_once and the topic
// template {aggregate_type}, a row addressed to __outboxrelay_positions,
// keyed with the transactional.id and holding FF/FFFFFFFF as its raw
// (debezium, text) payload, is dead-lettered and never produced. Before,
// it was produced into the positions topic inside the relay's own
// transaction, and after the next restart the relay skipped every later
// transaction: 3 of 6 rows lost, with status 0 and /readyz 200.
func TestExactlyOnceRowCannotWritePosition(t *testing.T) {
	e := newEnv(t)
	e.exec(`ALTER TABLE public.outbox ALTER COLUMN payload TYPE text USING payload::text`)
	cfg := []string{exactlyOnce, "OUTBOXRELAY_ENVELOPE_FORMAT=debezium", "OUTBOXRELAY_SINK_KAFKA_TOPIC={aggregate_type}"}
	c := e.consumeCommitted("order")
	p := e.start(cfg...)
	p.waitLog(`"streaming"`, 30*time.Second)

	var ids []string
	for range 2 {
		ids = append(ids, e.insert("public.outbox", "order", "1", 1)...)
	}
	var hostile string
	err := e.db.QueryRow(t.Context(), `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, $2, 'position.forged', 'FF/FFFFFFFF') RETURNING id::text`,
		kafka.DefaultPositionsTopic, kafka.TransactionalID("outboxrelay")).Scan(&hostile)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, e.insert("public.outbox", "order", "2", 1)...)
	if lost := lostAfter(c, ids, 60*time.Second); lost != 0 {
		t.Fatalf("%d of %d rows lost before the restart", lost, len(ids))
	}
	p.stop()

	p = e.start(cfg...)
	p.waitLog(`"streaming"`, 30*time.Second)
	for range 3 {
		ids = append(ids, e.insert("public.outbox", "order", "1", 1)...)
	}
	lost := lostAfter(c, ids, 30*time.Second)
	view := e.operatorView(p)
	reason := e.deadLetterError(hostile, 10*time.Second)
	t.Logf("rows %d (and 1 hostile), lost %d; %s; hostile row dead-lettered: %q", len(ids), lost, view, reason)
	if lost != 0 {
		t.Errorf("%d of %d rows lost after a row addressed the positions topic", lost, len(ids))
	}
	if !strings.Contains(reason, `kafka topic "__outboxrelay_positions" is reserved for the relay's exactly-once positions`) {
		t.Errorf("hostile row's dead letter: %q, want the reason that the topic is the relay's own", reason)
	}
	for _, r := range c.records() {
		if r.Headers["message_id"] == hostile {
			t.Errorf("the hostile row reached topic %s", r.Topic)
		}
	}
	p.stop()

	// Nothing but the relay's own position records is in the topic.
	rd, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(kafka.DefaultPositionsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	positions := 0
	for ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			positions++
			if len(r.Headers) != 1 || r.Headers[0].Key != kafka.PositionHeader || string(r.Value) == "FF/FFFFFFFF" {
				var names []string
				for _, h := range r.Headers {
					names = append(names, h.Key)
				}
				t.Errorf("positions topic holds a record the relay did not write: key %q, value %q, headers %v", r.Key, r.Value, names)
			}
		})
	}
	if positions == 0 {
		t.Error("the positions topic holds no record")
	}
}
