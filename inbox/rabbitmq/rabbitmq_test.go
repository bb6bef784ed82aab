package rabbitmq

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// amqpURL is the RabbitMQ the tests use (.ci/services starts it);
// OUTBOXRELAY_RABBITMQ_URL overrides.
func amqpURL() string {
	if u := os.Getenv("OUTBOXRELAY_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// The end-to-end test's consumers are child processes (consumertest), so
// that they can be killed with SIGKILL.
func TestMain(m *testing.M) { os.Exit(consumertest.Main(m, runChild)) }

func runChild(ctx context.Context, in *inbox.Inbox, h inbox.Handler, queue, _ string, batch int) error {
	r, err := New(in, h, Config{URL: amqpURL(), Queue: queue, Prefetch: 32, Batch: batch, DrainTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// TestConsumersKilledExactlyOnce: consumers of one queue (single active
// consumer, so that one aggregate is never in two consumers at once) on the
// shared RabbitMQ are killed with SIGKILL, two of them right after an inbox
// commit and before the ack, one by the test at a random point, while the
// producer side sends duplicates. Every effect must be applied exactly
// once, in per-account order; a consumer stopped with SIGTERM leaves
// nothing for the next one to redo.
func TestConsumersKilledExactlyOnce(t *testing.T) {
	t.Run("per message", func(t *testing.T) { testKilled(t, 0) })
	t.Run("batch", func(t *testing.T) { testKilled(t, 16) })
}

func testKilled(t *testing.T, batch int) {
	ctx := context.Background()
	conn, ch, queue := newQueue(t, "inbox-test", amqp.Table{"x-single-active-consumer": true})
	defer conn.Close()
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}

	pg := pgtest.Database(t)
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msgs := ledger.Generate(1500, 30)
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	// Published as the relay's RabbitMQ sink does: message-id and type
	// properties, aggregate headers, the envelope as the body.
	publish := func(ms []ledger.Msg) {
		var dcs []*amqp.DeferredConfirmation
		for _, m := range ms {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
				MessageId: m.ID, Type: "deposit", ContentType: "application/json", DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{"aggregate_type": "account", "aggregate_id": m.Account}, Body: m.Envelope(),
			})
			if err != nil {
				t.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				t.Fatalf("publish not confirmed: %v", err)
			}
		}
	}
	h := &consumertest.Harness{T: t, Target: queue, PG: pg, Dir: t.TempDir(), Batch: batch}

	upstreamDups := 0
	publish(msgs[:600])
	publish(msgs[400:600])
	upstreamDups += 200
	a := h.Start("a", 100) // active first; dies between commit and ack
	consumertest.WaitFor(t, "a to be active", 30*time.Second, func() bool { return a.Count("processed") > 0 })
	b := h.Start("b", 0) // standing by
	if err := a.WaitExit(t, 60*time.Second); err == nil || a.Count("crash") != 1 {
		t.Fatalf("consumer a exited with %v, crash noted %d times; want one crash", err, a.Count("crash"))
	}
	kills := 1

	publish(msgs[600:1100])
	publish(msgs[900:1100])
	upstreamDups += 200
	consumertest.WaitFor(t, "700 messages", 90*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) >= 700 })
	if err := b.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.WaitExit(t, 10*time.Second)
	kills++

	c := h.Start("c", 150)
	consumertest.WaitFor(t, "c to be active", 30*time.Second, func() bool { return c.Count("processed")+c.Count("duplicate") > 0 })
	e := h.Start("e", 0)
	publish(msgs[1100:])
	publish(msgs[1300:1400])
	upstreamDups += 100
	if err := c.WaitExit(t, 90*time.Second); err == nil || c.Count("crash") != 1 {
		t.Fatalf("consumer c exited with %v, crash noted %d times; want one crash", err, c.Count("crash"))
	}
	kills++

	consumertest.WaitFor(t, "every message", 120*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) == len(msgs) })
	// Stop e once the queue holds nothing, ready or unacknowledged: what e
	// holds unacknowledged (its prefetch, an upstream duplicate that has
	// just arrived) is not in a passive declare's count, and a stop hands
	// it back, to f. Every publish is confirmed by now, so nothing comes
	// after.
	consumertest.WaitFor(t, "every message acknowledged", 60*time.Second, func() bool { return queueMessages(t, queue) == 0 })
	if err := e.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitExit(t, 20*time.Second); err != nil || e.Count("stopped") != 1 {
		t.Fatalf("consumer e on SIGTERM: %v, stopped %d; want a clean stop", err, e.Count("stopped"))
	}
	// What f would get is in the queue now, whether or not f is consuming
	// by the time it is stopped.
	if n := queueMessages(t, queue); n != 0 {
		t.Errorf("the queue holds %d messages after e's clean stop; want 0 (acknowledged work handed back)", n)
	}
	f := h.Start("f", 0)
	time.Sleep(3 * time.Second)
	if err := f.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitExit(t, 20*time.Second); err != nil {
		t.Fatalf("consumer f on SIGTERM: %v", err)
	}
	if n := f.Count("processed") + f.Count("duplicate"); n != 0 {
		t.Errorf("consumer f got %d deliveries after a clean stop; want 0 (acknowledged work delivered again)", n)
	}

	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	delivered, skipped, dead := consumertest.Totals([]*consumertest.Consumer{a, b, c, e, f}...)
	t.Logf("batch %d: messages %d, upstream duplicates %d, consumers killed %d (2 in the commit-ack window), deliveries handled %d, duplicates skipped %d, dead letters %d; %v",
		batch, len(msgs), upstreamDups, kills, delivered, skipped, dead, r)
	if !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want 0", dead)
	}
	if skipped < upstreamDups {
		t.Errorf("duplicates skipped %d, fewer than the %d upstream duplicates", skipped, upstreamDups)
	}
}

func TestRawMapsProperties(t *testing.T) {
	raw := Raw(amqp.Delivery{MessageId: "m1", Type: "deposit", ContentType: "application/json",
		Headers: amqp.Table{"aggregate_id": "a1", "tenant": []byte("acme"), "retries": int32(3)}, Body: []byte("{}")})
	want := map[string]string{"message_id": "m1", "event_type": "deposit", "content-type": "application/json",
		"aggregate_id": "a1", "tenant": "acme", "retries": "3"}
	for k, v := range want {
		if raw.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, raw.Headers[k], v)
		}
	}
}
