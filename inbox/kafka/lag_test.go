package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/inbox/internal/consumertest"
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
