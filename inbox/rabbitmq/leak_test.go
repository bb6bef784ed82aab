package rabbitmq

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestRunReturnsAndLeavesNoGoroutine: a Runner in this process consumes a
// backlog, is stopped by its context while messages still arrive, returns
// within its drain bound and leaves no goroutine behind (its workers, the
// AMQP connection's).
func TestRunReturnsAndLeavesNoGoroutine(t *testing.T) {
	ctx := context.Background()
	conn, ch, queue := newQueue(t, "inbox-leak", nil)
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	msgs := ledger.Generate(400, 16)
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(pool, "billing", inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(ms []ledger.Msg) error {
		for _, m := range ms {
			err := ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
				MessageId: m.ID, Type: "deposit", ContentType: "application/json",
				Headers: amqp.Table{"aggregate_type": "account", "aggregate_id": m.Account}, Body: m.Envelope(),
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := publish(msgs[:300]); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	r, err := New(in, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return ledger.Apply(ctx, tx, m.ID, m.Payload, false)
	}, Config{URL: amqpURL(), Queue: queue, DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	consumertest.WaitFor(t, "200 messages", 60*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) >= 200 })
	published := make(chan error, 1)
	go func() { published <- publish(msgs[300:]) }() // still arriving when the stop comes
	stop()
	stopped := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end (drain 5s)")
	}
	t.Logf("stopped after %d of 400 messages in %v", consumertest.Runs(ctx, t, pool), time.Since(stopped))
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Error(err)
	}
	if err := conn.Close(); err != nil {
		t.Error(err)
	}
	pool.Close()
	goleak.VerifyNone(t, before)
}
