package nats

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
)

// TestLagReported: while the handler holds every message, the lag the
// Runner reports is the whole backlog (pending plus delivered and not
// acknowledged); once they are processed and acknowledged, it is 0.
func TestLagReported(t *testing.T) {
	ctx := context.Background()
	nc, js, stream, subject := newStream(ctx, t, "INBOXLAG")
	defer nc.Close()
	defer func() { _ = js.DeleteStream(ctx, stream) }()
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "billing",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	l := consumertest.NewLag(t, 40)
	for _, m := range l.Msgs {
		msg := nats.NewMsg(subject + ".account")
		msg.Header.Set("aggregate_type", "account")
		msg.Header.Set("aggregate_id", m.Account)
		msg.Data = m.Envelope()
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(l.In, l.Handler, Config{URL: natsURL(), Stream: stream, Consumer: "billing", MaxInFlight: 16,
		LagInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l.Check(t, int64(len(l.Msgs)), r.Run)
}
