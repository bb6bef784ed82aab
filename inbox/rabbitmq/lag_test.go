package rabbitmq

import (
	"context"
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
	conn, ch, queue := newQueue(t, "inbox-lag", nil)
	defer conn.Close()
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
	l.Check(t, int64(len(l.Msgs)-prefetch), r.Run)
}
