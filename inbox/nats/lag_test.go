package nats

import (
	"context"
	"fmt"
	"os"
	"strings"
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
	nc, err := nats.Connect(natsURL())
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("NATS: %v", err)
		}
		t.Skipf("NATS not reachable (CI=true makes this a failure): %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := fmt.Sprintf("INBOXLAG_%d_%d", os.Getpid(), time.Now().UnixNano())
	subject := strings.ToLower(stream)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}}); err != nil {
		t.Fatal(err)
	}
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
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	l.WaitTotal(t, int64(len(l.Msgs)), 30*time.Second)
	l.Release()
	l.WaitTotal(t, 0, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
