package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// TestRabbitMQRejectPublishLosesNothing relays 300 rows of 30 aggregates
// into a queue of 20 that nacks publishes beyond its length (x-overflow
// reject-publish), drained by a slow consumer (one unacknowledged delivery
// at a time, 5 ms each). The broker nacks many publishes and the relay
// retries them; every row must arrive, and within each aggregate the first
// copy of every row in commit order. A row the sink reported delivered
// without the broker taking it would be confirmed past and never arrive:
// the test fails as lost once the slot is confirmed past the batch while a
// row is missing and the queue holds no message, ready or unacknowledged,
// and tells that apart from a row still in flight. (A sink that reports
// every tenth nack delivered fails it within seconds: 28 of 300 lost.)
func TestRabbitMQRejectPublishLosesNothing(t *testing.T) {
	e := newEnv(t)
	pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
	// A passive declare counts ready messages only; rabbitmqctl counts the
	// unacknowledged ones too.
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatalf("rabbitmqctl not found: %v", err)
	}
	name := fmt.Sprintf("it-reject-%d", time.Now().UnixNano())
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(rabbitURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(name, false, false, false)
				ch.ExchangeDelete(name, false, false)
			}
			c.Close()
		}
	})
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-max-length": 20, "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var arrived []string // message ids in queue order
	var consumerRestarts int
	consumeCtx, stopConsumer := context.WithCancel(context.Background())
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for consumeCtx.Err() == nil {
			if err := slowConsume(consumeCtx, name, func(id string) {
				mu.Lock()
				arrived = append(arrived, id)
				mu.Unlock()
			}); err != nil && consumeCtx.Err() == nil {
				mu.Lock()
				consumerRestarts++
				mu.Unlock()
				t.Logf("consumer stopped (%v); consuming again", err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	defer func() {
		stopConsumer()
		<-consumed
	}()

	p := e.start("OUTBOXRELAY_SINK_TYPE=rabbitmq", "OUTBOXRELAY_SINK_RABBITMQ_URL="+rabbitURL, "OUTBOXRELAY_SINK_RABBITMQ_EXCHANGE="+name)
	p.waitLog(`"streaming"`, 30*time.Second)

	// The ledger: one transaction, rows in commit order, aggregate seq % 30.
	rows, err := e.db.Query(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', (g % 30)::text, 'order.created', jsonb_build_object('seq', g) FROM generate_series(1, 300) g
		RETURNING id::text, aggregate_id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ id, agg string }
	ledger, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.agg)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	var committedAt string // a position at or after the commit
	if err := e.db.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&committedAt); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	// The verdict does not depend on speed. A row is lost once the relay
	// has confirmed the slot past the batch (the broker acknowledged every
	// row, as the sink reported it) while the row has not arrived and the
	// queue is drained. Until then a missing row is in flight: under a
	// sustained overflow a row can be nacked many times in a row, and its
	// retries back off exponentially to 30 s (with jitter), so on a loaded
	// machine the batch can take minutes. The deadline is only a bound.
	const timeout = 10 * time.Minute
	deadline := start.Add(timeout)
	var missing []string
	var got []string
	lookAgain := func() {
		mu.Lock()
		got = append(got[:0], arrived...)
		mu.Unlock()
		seen := map[string]bool{}
		for _, id := range got {
			seen[id] = true
		}
		missing = missing[:0]
		for _, r := range ledger {
			if !seen[r.id] {
				missing = append(missing, r.id)
			}
		}
	}
	lastLog := start
	for {
		lookAgain()
		if len(missing) == 0 {
			break
		}
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspect queue: %v", err)
		}
		var confirmedPast bool
		if err := e.db.QueryRow(t.Context(), `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxrelay'`,
			committedAt).Scan(&confirmedPast); err != nil {
			t.Fatal(err)
		}
		// No ready message is not a drained queue: the consumer's delivery
		// in hand is unacknowledged, and not counted. Once the slot is
		// confirmed past the batch every row is in the queue or has been
		// consumed (recorded before its ack), so a queue that then holds
		// nothing at all, and a row still missing after it, is a loss.
		if confirmedPast && q.Messages == 0 && queueMessages(t, name) == 0 {
			if lookAgain(); len(missing) == 0 {
				break
			}
			t.Fatalf("reject-publish: committed %d, arrived %d, LOST %d: the slot was confirmed past rows that never arrived and the queue is empty (first %s)",
				len(ledger), len(ledger)-len(missing), len(missing), missing[0])
		}
		if time.Now().After(deadline) {
			t.Fatalf("reject-publish: committed %d, arrived %d, %d still in flight after %s (the slot is not confirmed past them: slow, not lost)",
				len(ledger), len(ledger)-len(missing), len(missing), timeout)
		}
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			t.Logf("after %s: arrived %d of %d, queue holds %d ready, slot confirmed past the batch: %v",
				time.Since(start).Round(time.Second), len(ledger)-len(missing), len(ledger), q.Messages, confirmedPast)
		}
		time.Sleep(200 * time.Millisecond)
	}
	elapsed := time.Since(start)
	p.stop()

	// Within each aggregate, the first copy of every row arrives in commit order.
	pos := map[string]int{}
	aggOf := map[string]string{}
	for i, r := range ledger {
		pos[r.id], aggOf[r.id] = i, r.agg
	}
	seen := map[string]bool{}
	last := map[string]string{}
	disorders, dups := 0, 0
	for _, id := range got {
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		if prev, ok := last[aggOf[id]]; ok && pos[prev] > pos[id] {
			if disorders++; disorders <= 5 {
				t.Errorf("aggregate %s: first delivery of row %s after row %s, committed later", aggOf[id], id, prev)
			}
		}
		last[aggOf[id]] = id
	}
	nacks := strings.Count(p.out.String(), "publish failed; retrying")
	t.Logf("reject-publish: committed %d, arrived %d, lost 0, out of order %d, duplicates %d, nacked and retried %d times, consumer restarts %d, all in %s",
		len(ledger), len(ledger), disorders, dups, nacks, consumerRestarts, elapsed.Round(100*time.Millisecond))
	if nacks == 0 {
		t.Error("the queue never rejected a publish: the test exercised nothing")
	}
}

// slowConsume consumes the queue one delivery at a time (prefetch 1),
// taking 5 ms over each, until ctx ends or the channel closes. A delivery
// is recorded before it is acknowledged, so that one the queue no longer
// holds has arrived (one whose ack is lost arrives again: a duplicate).
func slowConsume(ctx context.Context, queue string, got func(messageID string)) error {
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-closed:
			return fmt.Errorf("channel closed: %v", err)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("deliveries closed")
			}
			time.Sleep(5 * time.Millisecond) // a slow consumer
			got(d.MessageId)
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
		}
	}
}

// queueMessages is how many messages queue holds, ready or delivered and
// not yet acknowledged, as RabbitMQ counts them now (rabbitmqctl
// list_queues, in the default vhost).
func queueMessages(t *testing.T, queue string) int {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name", "messages").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("rabbitmqctl list_queues: queue %s: %q is not a count", queue, f[1])
			}
			return n
		}
	}
	t.Fatalf("rabbitmqctl list_queues does not list queue %s:\n%s", queue, out)
	return 0
}
