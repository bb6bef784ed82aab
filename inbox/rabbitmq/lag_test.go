package rabbitmq

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// TestLagReported: while the handler holds the prefetched deliveries, the
// lag the Runner reports is the messages still ready in the queue (the
// backlog less the prefetch); once all are processed and acknowledged, it
// is 0.
func TestLagReported(t *testing.T) {
	ctx := context.Background()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("RabbitMQ: %v", err)
		}
		t.Skipf("RabbitMQ not reachable (CI=true makes this a failure): %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := fmt.Sprintf("inbox-lag-%d-%d", os.Getpid(), time.Now().UnixNano())
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
	l := consumertest.NewLag(t, 40)
	for _, m := range l.Msgs {
		if err := ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
			MessageId: m.ID, ContentType: "application/json",
			Headers: amqp.Table{"aggregate_type": "account", "aggregate_id": m.Account}, Body: m.Envelope(),
		}); err != nil {
			t.Fatal(err)
		}
	}
	const prefetch = 10
	r, err := New(l.In, l.Handler, Config{URL: amqpURL(), Queue: queue, Prefetch: prefetch, LagInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	l.WaitTotal(t, int64(len(l.Msgs)-prefetch), 30*time.Second)
	l.Release()
	l.WaitTotal(t, 0, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
