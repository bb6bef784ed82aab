package kafka

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// TestPipelinedLogsNoFlushes checks that a pipelined sink does not log
// franz-go's "flushing" line for each round, while its other info lines
// (the producer id) still reach the log.
func TestPipelinedLogsNoFlushes(t *testing.T) {
	c := newCluster(t)
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := New(Config{Brokers: c.ListenAddrs()}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if !s.Pipeline() {
		t.Fatal("the sink did not pipeline")
	}
	for i := range 20 {
		m := &relay.Message{ID: "m" + string(rune('a'+i)), AggregateType: "order", AggregateID: "1", EventType: "order.created", Envelope: []byte(`{}`)}
		if err := publishOne(t, s, m); err != nil {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
	}
	if n := logs.FilterMessage("flushing").Len(); n > 0 {
		t.Errorf("%d \"flushing\" lines logged for 20 records, want none", n)
	}
	if logs.FilterMessageSnippet("producer id").Len() == 0 {
		t.Error("no producer id line logged: the client's other info lines are lost too")
	}
}

// TestPipelineRoundsHoldAtMostMaxRound checks the bound on a round: with
// more records ready than maxRound, franz-go never holds more than maxRound
// of them at once, both when records join a round being flushed and when a
// round is taken from the queue, and every record is still acknowledged
// once and stored once, in order per aggregate.
//
// The first produce request is held at the broker until every message is
// published, so that the round it belongs to is open while the others
// arrive: records of aggregates with nothing in the sink join it until it
// holds maxRound, and the rest queue (the second record of each aggregate
// among them). Once released, the queue holds more than maxRound records.
func TestPipelineRoundsHoldAtMostMaxRound(t *testing.T) {
	// More aggregates than maxRound, two messages each; a maxRound at or
	// above the window bounds nothing, and this test must fail then, so the
	// sizes do not follow it past a quarter of the window.
	aggregates := min(maxRound, DefaultMaxInFlight/4) * 5 / 4
	n := 2 * aggregates
	c := newCluster(t, kfake.SeedTopics(4, "outbox.order"))
	var held bufferedPeak
	s := newSink(t, c, Config{Opts: []kgo.Opt{kgo.WithHooks(&held)}})
	if !s.Pipeline() {
		t.Fatal("the sink did not pipeline")
	}
	cons := newConsumer(t, c, "outbox.order")

	arrived, release := make(chan struct{}), make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl()
		close(arrived)
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})

	// Messages gives each aggregate its first message before any second one.
	msgs := sinktest.Messages("order", n, aggregates)
	tr := sinktest.NewTracker(msgs)
	ctx := t.Context()
	s.Publish(ctx, msgs[0], tr.Done)
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("no produce request within 30s")
	}
	for _, m := range msgs[1:] {
		s.Publish(ctx, m, tr.Done)
	}
	if got := held.now.Load(); got != maxRound {
		t.Errorf("the open round holds %d records once %d are published, want maxRound (%d)", got, n, maxRound)
	}
	close(release)

	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)
	if got := held.peak.Load(); got != maxRound {
		t.Errorf("franz-go held up to %d records at once, with %d ready; want maxRound (%d)", got, n, maxRound)
	}
	if got := held.now.Load(); got != 0 {
		t.Errorf("franz-go still holds %d records once all are acknowledged", got)
	}

	checkStoredOnceInOrder(ctx, t, cons, msgs)
}

// bufferedPeak counts the records franz-go holds, from Produce until just
// before their promise, and the most it held at once.
type bufferedPeak struct{ now, peak atomic.Int64 }

var (
	_ kgo.HookProduceRecordBuffered   = (*bufferedPeak)(nil)
	_ kgo.HookProduceRecordUnbuffered = (*bufferedPeak)(nil)
)

// OnProduceRecordBuffered implements kgo.HookProduceRecordBuffered.
func (b *bufferedPeak) OnProduceRecordBuffered(*kgo.Record) {
	n := b.now.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// OnProduceRecordUnbuffered implements kgo.HookProduceRecordUnbuffered.
func (b *bufferedPeak) OnProduceRecordUnbuffered(*kgo.Record, error) { b.now.Add(-1) }
