package kafka

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
	"github.com/outboxrelay/outboxrelay/inbox/internal/pgtest"
)

// TestLagReported: while the handler holds every record, the lag the
// Runner reports is the whole backlog (nothing committed); once the
// records are processed and their offsets committed, it is 0.
func TestLagReported(t *testing.T) {
	ctx := context.Background()
	l := consumertest.NewLag(t, 40)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "lag"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for _, m := range l.Msgs {
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "lag", Key: []byte(m.Account), Value: m.Envelope()}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(l.In, l.Handler, Config{Brokers: cluster.ListenAddrs(), Group: "lag", Topics: []string{"lag"},
		CommitInterval: 50 * time.Millisecond, LagInterval: 50 * time.Millisecond,
		Opts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		t.Fatal(err)
	}
	l.Check(t, int64(len(l.Msgs)), r.Run)
}

// TestLagOfUnfetchedPartition: partitions the Runner is assigned but has
// never fetched a record from (they are empty, so franz-go surfaces no
// fetch of them) have a lag reading of 0, not none.
func TestLagOfUnfetchedPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	last := map[string]int64{}
	in, err := inbox.New(pool, "lag-empty", inbox.Config{Observer: inbox.Observer{Lag: func(source string, n int64) {
		mu.Lock()
		last[source] = n
		mu.Unlock()
	}}})
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	handler := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	r, err := New(in, handler, Config{Brokers: cluster.ListenAddrs(), Group: "lag-empty", Topics: []string{"empty"},
		CommitInterval: 50 * time.Millisecond, LagInterval: 50 * time.Millisecond,
		Opts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	var got map[string]int64
	consumertest.WaitFor(t, "lag readings of 0 for both partitions", 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		got = maps.Clone(last)
		l0, ok0 := last["empty/0"]
		l1, ok1 := last["empty/1"]
		return ok0 && ok1 && l0 == 0 && l1 == 0
	})
	t.Logf("lag readings %v", got)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
