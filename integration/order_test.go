package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// committedTx is one committed transaction of the ledger.
type committedTx struct {
	agg string
	ids []string
}

// TestAggregateOrderUnderProduceFaults writes rows over 13 aggregates while
// kfake fails produce requests the ways a rolling restart does: partitions
// answer UNKNOWN_TOPIC_OR_PARTITION for longer than franz-go's own
// unknown-topic retries last, another partition answers
// NOT_LEADER_FOR_PARTITION, and connections are cut. Checked against the
// ledger of committed rows: nothing is lost or dead-lettered, and within each
// aggregate the first copy of every row is consumed in commit order.
//
// relay.max_attempts is 1 so that a failure classified as permanent is
// dead-lettered at its first report rather than several franz-go give-ups
// (15 s each) later; a retryable one is retried without limit either way.
func TestAggregateOrderUnderProduceFaults(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_RELAY_MAX_ATTEMPTS=1")
	p.waitLog(`"streaming"`, 30*time.Second)
	c.waitIDs(e.insert("outbox", "order", "warmup", 4), 30*time.Second) // creates the topic

	var mu sync.Mutex
	var ledger []committedTx
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 500; i++ {
			agg := fmt.Sprint(i % 13)
			ids := e.insertRetry("outbox", "order", agg, 1+i%7)
			mu.Lock()
			ledger = append(ledger, committedTx{agg, ids})
			mu.Unlock()
			time.Sleep(40 * time.Millisecond)
		}
	}()

	// A rolling restart, seen from the producer: two partitions unknown for
	// 20 s, another without a leader for a while, connections cut.
	unknown := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.order", Partitions: []int32{0, 1},
		Err: kerr.UnknownTopicOrPartition, Count: -1})
	time.Sleep(4 * time.Second)
	notLeader := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.order", Partitions: []int32{2},
		Err: kerr.NotLeaderForPartition, Count: -1})
	time.Sleep(4 * time.Second)
	notLeader.Remove()
	var cutMu sync.Mutex
	cut := true
	e.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cutMu.Lock()
		defer cutMu.Unlock()
		if !cut {
			return nil, nil, false
		}
		e.kafka.KeepControl()
		return nil, errors.New("connection cut"), true
	})
	time.Sleep(2 * time.Second)
	cutMu.Lock()
	cut = false
	cutMu.Unlock()
	time.Sleep(10 * time.Second)
	unknown.Remove()
	t.Logf("faults removed: %d produce requests answered UNKNOWN_TOPIC_OR_PARTITION, %d NOT_LEADER_FOR_PARTITION",
		unknown.Hits(), notLeader.Hits())
	if unknown.Hits() == 0 || notLeader.Hits() == 0 {
		t.Error("a fault was never hit: the test exercised nothing")
	}
	<-done

	var ids []string
	for _, tx := range ledger {
		ids = append(ids, tx.ids...)
	}
	recs := c.waitIDs(ids, 120*time.Second)
	p.stop()

	// Commit order per aggregate: rows of one transaction in id order,
	// transactions in the order they committed (one writer).
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
		if _, ok := pos[id]; !ok || seen[id] {
			continue // warm-up rows and later copies
		}
		seen[id] = true
		if r.Key != aggOf[id] {
			t.Errorf("row %s of aggregate %s has key %q", id, aggOf[id], r.Key)
		}
		if prev, ok := last[r.Key]; ok && pos[prev] > pos[id] {
			if disorders++; disorders <= 5 {
				t.Errorf("aggregate %s: first delivery of row %s after row %s, committed later", r.Key, id, prev)
			}
		}
		last[r.Key] = id
	}
	if disorders > 0 {
		t.Errorf("%d rows delivered first after a row of their aggregate committed later", disorders)
	}

	out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
	if code != 0 {
		t.Fatalf("dlq list exit %d: %s", code, out)
	}
	var letters []map[string]any
	if err := json.Unmarshal([]byte(out), &letters); err != nil {
		t.Fatalf("dlq list --json: %v\n%s", err, out)
	}
	if len(letters) > 0 {
		t.Errorf("%d rows dead-lettered, want 0: first %v", len(letters), letters[0])
	}
	t.Logf("produce faults: rows %d, lost 0, dead-lettered %d, out of order %d, duplicates %d",
		len(ids), len(letters), disorders, duplicates(recs))
}

// TestEmitInSubtransactionKeepsOrder: a table-less message written inside a
// savepoint, then a row written after the savepoint is released, arrive in
// that order. PostgreSQL decodes them the other way round: it files a
// transactional message under the end of its WAL record and a row under the
// start of its own, so the two share one position, and its reorder buffer
// merges a transaction's subtransactions by position without a tie-break.
// Found by the nemesis (TestNemesisKafka).
func TestEmitInSubtransactionKeepsOrder(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	var ids []string
	for i := range 10 {
		emitted, inserted := fmt.Sprintf("00000000-0000-4000-8000-%012d", 2*i), fmt.Sprintf("00000000-0000-4000-8000-%012d", 2*i+1)
		e.exec(fmt.Sprintf(`BEGIN;
			SAVEPOINT s;
			SELECT pg_logical_emit_message(true, 'outboxrelay', '{"id": "%s", "aggregate_type": "order", "aggregate_id": "1", "event_type": "emitted", "payload": {}}');
			RELEASE SAVEPOINT s;
			INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ('%s', 'order', '1', 'created', '{}');
			COMMIT`, emitted, inserted))
		ids = append(ids, emitted, inserted)
	}
	recs := c.waitIDs(ids, 30*time.Second)
	p.stop()
	var got []string
	for _, r := range recs {
		got = append(got, r.Headers["message_id"])
	}
	if !slices.Equal(got, ids) {
		t.Errorf("arrival order differs from commit order:\n got %v\nwant %v", got, ids)
	}
}
