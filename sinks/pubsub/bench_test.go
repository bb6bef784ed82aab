package pubsub

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The sink against the bare Pub/Sub publisher publishing the same
// messages (data, ordering key, the same attributes) to the same pstest
// server, so that the ratio of the two is the sink's cost: headers as
// attributes, checks, per-message outcomes.
//
//	go test -run '^$' -bench . ./sinks/pubsub

func BenchmarkSink(b *testing.B) {
	newFixture(b).createTopic(b, "bench")
	s := startSink(b, Config{Project: project, Topic: "bench", Timeout: 10 * time.Second})
	sinktest.BenchmarkPublish(b, s, sinktest.Messages("bench", b.N, 1000))
}

func BenchmarkBareClient(b *testing.B) {
	f := newFixture(b)
	f.createTopic(b, "bench")
	p := f.client.Publisher("bench")
	p.EnableMessageOrdering = true
	defer p.Stop()
	msgs := sinktest.Messages("bench", b.N, 1000)
	results := make([]*pubsub.PublishResult, len(msgs))
	b.ResetTimer()
	for i, m := range msgs {
		hs, _ := sinks.PubSub.Headers(nil, m)
		attrs := make(map[string]string, len(hs))
		for _, h := range hs {
			attrs[h.Key] = h.Value
		}
		results[i] = p.Publish(context.Background(), &pubsub.Message{Data: m.Envelope, OrderingKey: m.AggregateID, Attributes: attrs})
	}
	for _, r := range results {
		if _, err := r.Get(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}
