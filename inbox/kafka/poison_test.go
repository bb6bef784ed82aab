package kafka

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/ledger"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestPoisonParkedThroughKafka: a message that always fails is
// dead-lettered after the limit and its account's later messages are
// parked, while the runner moves on and commits past all of them; a replay
// releases the chain in order, and a consumer started afterwards finds
// nothing new to do.
//
// In batch mode the poison message fails inside a batch: the batch's other
// records commit, and the poison one falls back to its own transaction.
// "requested": the replay is requested from outside, as `outboxrelay inbox
// dlq replay` does (inbox.RequestReplay), and the running runner runs it.
func TestPoisonParkedThroughKafka(t *testing.T) {
	t.Run("per message", func(t *testing.T) { testPoison(t, 0, false) })
	t.Run("batch", func(t *testing.T) { testPoison(t, 16, false) })
	t.Run("requested", func(t *testing.T) { testPoison(t, 0, true) })
}

func testPoison(t *testing.T, batch int, requested bool) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msgs := ledger.Generate(90, 3)
	poison := 3 * 10 // acct-000's 11th message
	msgs[poison].Poison = true
	if err := ledger.Setup(ctx, pool, msgs); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(m.Account), Value: m.Envelope()}
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var poisoned atomic.Bool
	poisoned.Store(true)
	var processed, parked, dead, duplicates atomic.Int64
	in, err := inbox.New(pool, group, inbox.Config{MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		ReplayInterval: 100 * time.Millisecond,
		Observer: inbox.Observer{
			Processed:    func(inbox.Message, time.Duration) { processed.Add(1) },
			Parked:       func(inbox.Message) { parked.Add(1) },
			DeadLettered: func(inbox.Message, error) { dead.Add(1) },
			Duplicate:    func(inbox.Message) { duplicates.Add(1) },
		}})
	if err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return ledger.Apply(ctx, tx, m.ID, m.Payload, poisoned.Load())
	}
	run := func() (stop func()) {
		r, err := New(in, handler, Config{Brokers: cluster.ListenAddrs(), Group: group, Topics: []string{topic},
			Batch: batch, CommitInterval: 50 * time.Millisecond, Opts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	}
	stop := run()
	behind := int64(len(msgs)/3 - 11) // acct-000's messages after the poison one
	consumertest.WaitFor(t, "the poison message and its chain", 60*time.Second, func() bool {
		return dead.Load() == 1 && parked.Load() == behind && processed.Load() == int64(len(msgs))-1-behind
	})
	if !requested {
		stop()
	}
	st, err := in.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Parked) != 1 || st.Parked[0].Waiting != int(behind) {
		t.Fatalf("status = %+v, want acct-000 parked with %d waiting", st, behind)
	}

	poisoned.Store(false)
	var rr inbox.ReplayResult
	if requested {
		if _, err := inbox.RequestReplay(ctx, pool, "", st.Parked[0].DeadLetterID, group, "test"); err != nil {
			t.Fatal(err)
		}
		consumertest.WaitFor(t, "the runner to run the requested replay", 60*time.Second, func() bool {
			return processed.Load() == int64(len(msgs))
		})
		stop()
		rr.Processed = int(behind) + 1
		if st, err := in.Status(ctx); err != nil || len(st.DeadLetters) != 0 {
			t.Fatalf("after the requested replay: %+v, %v; want no dead letter left", st, err)
		}
	} else if rr, err = in.Replay(ctx, st.Parked[0].DeadLetterID, handler); err != nil || rr.Processed != int(behind)+1 {
		t.Fatalf("replay = %+v, %v; want %d processed", rr, err, behind+1)
	}
	// The offsets of the dead letter and the parked messages were
	// committed: a new consumer of the group has nothing to redo. The
	// group's offsets say so whether or not that consumer has fetched by
	// the time it is stopped.
	if n := uncommitted(t, cluster.ListenAddrs(), topic); n != 0 {
		t.Errorf("%d records not committed after the runner stopped; want 0 (offsets not committed)", n)
	}
	deliveries := func() int64 { return processed.Load() + duplicates.Load() + parked.Load() + dead.Load() }
	before := deliveries()
	stop = run()
	time.Sleep(2 * time.Second)
	stop()
	if got := deliveries() - before; got != 0 {
		t.Errorf("a consumer after the replay got %d deliveries, want 0 (offsets not committed)", got)
	}
	r, err := ledger.Check(ctx, pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("batch %d: poison through Kafka: dead letters %d, parked %d, replayed %d; %v", batch, dead.Load(), parked.Load(), rr.Processed, r)
	if !r.ExactlyOnce() {
		t.Fatalf("not exactly once: %v", r)
	}
}
