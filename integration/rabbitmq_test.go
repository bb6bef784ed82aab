package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// amqpQueue is a durable queue bound to a fresh topic exchange.
type amqpQueue struct {
	t        *testing.T
	exchange string
	mu       sync.Mutex
	got      []amqp.Delivery
}

// rabbitEnv binds a queue with key to a new exchange and returns the
// environment that points the relay at it.
func rabbitEnv(t *testing.T, key string) (*amqpQueue, []string) {
	t.Helper()
	pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
	name := fmt.Sprintf("it-%d", time.Now().UnixNano())
	q := &amqpQueue{t: t, exchange: name}
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, key, name, false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		q.consume(ctx, name)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if c, err := amqp.Dial(rabbitURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(name, false, false, false)
				ch.ExchangeDelete(name, false, false)
			}
			c.Close()
		}
	})
	return q, []string{
		"OUTBOXRELAY_SINK_TYPE=rabbitmq",
		"OUTBOXRELAY_SINK_RABBITMQ_URL=" + rabbitURL,
		"OUTBOXRELAY_SINK_RABBITMQ_EXCHANGE=" + name,
	}
}

// consume reads the queue, reconnecting while the broker restarts.
func (q *amqpQueue) consume(ctx context.Context, name string) {
	for ctx.Err() == nil {
		conn, err := amqp.Dial(rabbitURL)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		ch, err := conn.Channel()
		if err == nil {
			var msgs <-chan amqp.Delivery
			// Manual acks: with auto-ack, deliveries in the socket when the
			// broker stops are gone, and the test would blame the relay.
			msgs, err = ch.Consume(name, "", false, false, false, false, nil)
			for err == nil {
				select {
				case <-ctx.Done():
					err = ctx.Err()
				case d, ok := <-msgs:
					if !ok {
						err = fmt.Errorf("closed")
						break
					}
					q.mu.Lock()
					q.got = append(q.got, d)
					q.mu.Unlock()
					_ = d.Ack(false)
				}
			}
		}
		conn.Close()
	}
}

func (q *amqpQueue) waitIDs(ids []string, timeout time.Duration) []amqp.Delivery {
	q.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		q.mu.Lock()
		got := append([]amqp.Delivery(nil), q.got...)
		q.mu.Unlock()
		seen := map[string]bool{}
		for _, d := range got {
			seen[d.MessageId] = true
		}
		missing := 0
		for _, id := range ids {
			if !seen[id] {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			q.t.Fatalf("%d of %d messages missing after %s (received %d)", missing, len(ids), timeout, len(got))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func amqpDuplicates(ds []amqp.Delivery) int {
	n := map[string]int{}
	d := 0
	for _, x := range ds {
		if n[x.MessageId]++; n[x.MessageId] == 2 {
			d++
		}
	}
	return d
}

// TestRabbitMQEndToEnd: envelope, properties and headers as the README says,
// per-aggregate order, and rolled-back rows never arrive.
func TestRabbitMQEndToEnd(t *testing.T) {
	e := newEnv(t)
	q, env := rabbitEnv(t, "order.#")
	p := e.start(env...)
	p.waitLog(`"streaming"`, 30*time.Second)
	ctx := t.Context()

	tx, _ := e.db.Begin(ctx)
	tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'ghost', 'order.created', '{}')`)
	tx.Rollback(ctx)
	var first string
	err := e.db.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, traceparent)
		VALUES ('order', '42', 'created', '{"total": 5}', '{"tenant": "acme"}', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
		RETURNING id::text`).Scan(&first)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{first}
	for i := 0; i < 20; i++ {
		ids = append(ids, e.insert("outbox", "order", fmt.Sprint(i%3), 50)...)
	}
	got := q.waitIDs(ids, 60*time.Second)
	last := map[string]float64{}
	for _, d := range got {
		var env map[string]any
		if err := json.Unmarshal(d.Body, &env); err != nil {
			t.Fatalf("body is not JSON: %v", err)
		}
		if env["aggregate_id"] == "ghost" {
			t.Fatal("a rolled-back row arrived")
		}
		if d.MessageId == first {
			if d.Type != "created" || d.ContentType != "application/json" || d.DeliveryMode != amqp.Persistent ||
				d.AppId != "outboxrelay" || d.Timestamp.IsZero() || d.RoutingKey != "order.created" {
				t.Errorf("properties: type %q content %q mode %d app %q ts %v key %q", d.Type, d.ContentType, d.DeliveryMode, d.AppId, d.Timestamp, d.RoutingKey)
			}
			for k, v := range map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"aggregate_id": "42", "aggregate_type": "order", "tenant": "acme"} {
				if fmt.Sprint(d.Headers[k]) != v {
					t.Errorf("header %s = %v, want %s", k, d.Headers[k], v)
				}
			}
			continue
		}
		seq := env["payload"].(map[string]any)["seq"].(float64)
		key := fmt.Sprint(env["aggregate_id"])
		if prev, ok := last[key]; ok && seq <= prev && seq != 1 {
			t.Fatalf("aggregate %s: seq %v after %v", key, seq, prev)
		}
		last[key] = seq
	}
	p.stop()
}

// TestRabbitMQUnroutable: a message no queue takes is never confirmed past;
// it is dead-lettered after the configured attempts and the relay goes on.
func TestRabbitMQUnroutable(t *testing.T) {
	e := newEnv(t)
	q, env := rabbitEnv(t, "order.#")
	p := e.start(append(env, "OUTBOXRELAY_RELAY_MAX_ATTEMPTS=3")...)
	p.waitLog(`"streaming"`, 30*time.Second)
	var lost string
	if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('invoice', '1', 'issued', '{}') RETURNING id::text`).Scan(&lost); err != nil || lost == "" {
		t.Fatalf("insert the unroutable row: id %q, %v", lost, err)
	}
	ids := e.insert("outbox", "order", "1", 10)
	q.waitIDs(ids, 30*time.Second)
	// The letter is matched by its message id in the JSON listing: a
	// substring of the text listing matched any row, and with an empty id
	// any unroutable letter passed.
	if msg := deadLetterError(t, e, lost); !strings.Contains(msg, "unroutable") {
		t.Fatalf("dead letter of %s has error %q, want unroutable", lost, msg)
	}
	p.stop()
}

// TestRabbitMQBrokerRestart stops and starts the RabbitMQ application in the
// middle of a stream; every row arrives after recovery.
func TestRabbitMQBrokerRestart(t *testing.T) {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatalf("rabbitmqctl not found: %v", err)
	}
	e := newEnv(t)
	q, env := rabbitEnv(t, "order.#")
	p := e.start(env...)
	p.waitLog(`"streaming"`, 30*time.Second)
	wait := e.insertLoop(100, 50, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	if out, err := exec.Command("rabbitmqctl", "stop_app").CombinedOutput(); err != nil {
		t.Fatalf("stop_app: %v %s", err, out)
	}
	t.Log("RabbitMQ stopped")
	time.Sleep(2 * time.Second)
	if out, err := exec.Command("rabbitmqctl", "start_app").CombinedOutput(); err != nil {
		t.Fatalf("start_app: %v %s", err, out)
	}
	exec.Command("rabbitmqctl", "await_startup").Run()
	t.Log("RabbitMQ started")
	ids := wait()
	got := q.waitIDs(ids, 120*time.Second)
	p.stop()
	t.Logf("rabbitmq restart: rows %d, lost 0, duplicates %d", len(ids), amqpDuplicates(got))
}
