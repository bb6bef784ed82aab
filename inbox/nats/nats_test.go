package nats

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// natsURL is the NATS JetStream the tests use (.ci/services starts it);
// OUTBOXRELAY_NATS_URL overrides.
func natsURL() string {
	if u := os.Getenv("OUTBOXRELAY_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// The end-to-end test's consumers are child processes (consumertest), so
// that they can be killed with SIGKILL.
func TestMain(m *testing.M) { os.Exit(consumertest.Main(m, runChild)) }

func runChild(ctx context.Context, in *inbox.Inbox, h inbox.Handler, stream, _ string, batch int) error {
	r, err := New(in, h, Config{URL: natsURL(), Stream: stream, Consumer: consumertest.Name, MaxInFlight: 32, Batch: batch,
		DrainTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// TestConsumersKilledExactlyOnce: consumers of one durable pull consumer,
// one process at a time (JetStream would spread an aggregate over two), are
// killed with SIGKILL, two of them right after an inbox commit and before
// the ack, one by the test at a random point, while the producer side sends
// duplicates (without Nats-Msg-Id, as a replay older than the stream's
// duplicate window arrives). Every effect must be applied exactly once, in
// per-account order; a consumer stopped with SIGTERM leaves nothing for the
// next one to redo.
func TestConsumersKilledExactlyOnce(t *testing.T) {
	t.Run("per message", func(t *testing.T) { testKilled(t, 0) })
	t.Run("batch", func(t *testing.T) { testKilled(t, 16) })
}

func testKilled(t *testing.T, batch int) {
	ctx := context.Background()
	nc, js, stream, subject := newStream(ctx, t, "INBOXTEST")
	defer nc.Close()
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "billing",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second, MaxAckPending: 256})
	if err != nil {
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
	// Published as the relay's NATS sink does, less Nats-Msg-Id: the
	// relay's headers and the envelope as the data.
	publish := func(ms []ledger.Msg) {
		for _, m := range ms {
			msg := nats.NewMsg(subject + ".account")
			msg.Header.Set("message_id", m.ID)
			msg.Header.Set("event_type", "deposit")
			msg.Header.Set("aggregate_type", "account")
			msg.Header.Set("aggregate_id", m.Account)
			msg.Header.Set("content-type", "application/json")
			msg.Data = m.Envelope()
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	h := &consumertest.Harness{T: t, Target: stream, PG: pg, Dir: t.TempDir(), Batch: batch}

	upstreamDups := 0
	publish(msgs[:600])
	publish(msgs[400:600])
	upstreamDups += 200
	a := h.Start("a", 100) // dies between its inbox commit and its ack
	if err := a.WaitExit(t, 60*time.Second); err == nil || a.Count("crash") != 1 {
		t.Fatalf("consumer a exited with %v, crash noted %d times; want one crash", err, a.Count("crash"))
	}
	kills := 1

	b := h.Start("b", 0)
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
	publish(msgs[1100:])
	publish(msgs[1300:1400])
	upstreamDups += 100
	if err := c.WaitExit(t, 90*time.Second); err == nil || c.Count("crash") != 1 {
		t.Fatalf("consumer c exited with %v, crash noted %d times; want one crash", err, c.Count("crash"))
	}
	kills++

	e := h.Start("e", 0)
	consumertest.WaitFor(t, "every message", 120*time.Second, func() bool { return consumertest.Runs(ctx, t, pool) == len(msgs) })
	acknowledged := func() (pending, ackPending uint64) {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending, uint64(info.NumAckPending)
	}
	consumertest.WaitFor(t, "every message acknowledged", 60*time.Second, func() bool {
		p, a := acknowledged()
		return p == 0 && a == 0
	})
	if err := e.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitExit(t, 20*time.Second); err != nil || e.Count("stopped") != 1 {
		t.Fatalf("consumer e on SIGTERM: %v, stopped %d; want a clean stop", err, e.Count("stopped"))
	}
	// What f would get is pending in the consumer now, whether or not f
	// is consuming by the time it is stopped.
	if p, a := acknowledged(); p != 0 || a != 0 {
		t.Errorf("after e's clean stop the consumer has %d messages pending and %d awaiting an ack; want 0 and 0 (acknowledged work handed back)", p, a)
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
