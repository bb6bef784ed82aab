package kafka

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/relay"
)

// benchMessages returns n messages over the given number of aggregates with
// envelopes of about size bytes of JSON, compressible like real envelopes.
func benchMessages(n, aggregates, size int) []*relay.Message {
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := make([]*relay.Message, n)
	for i := range msgs {
		id := fmt.Sprintf("0193a5b0-7d4e-7c1a-9f3e-%012x", i)
		agg := fmt.Sprint(i % aggregates)
		env := fmt.Appendf(nil, `{"envelope_version":1,"message_id":%q,"event_type":"order.created","schema_version":1,"aggregate_type":"order","aggregate_id":%q,"payload":{"items":[`, id, agg)
		for len(env) < size-40 {
			env = fmt.Appendf(env, `{"sku":"%08x","qty":%d},`, rng.Uint32(), rng.IntN(10))
		}
		env = append(env[:len(env)-1], `],"total":"99.90"}}`...)
		msgs[i] = &relay.Message{
			ID:            id,
			AggregateType: "order",
			AggregateID:   agg,
			EventType:     "order.created",
			Table:         "public.outbox",
			Traceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Envelope:      env,
		}
	}
	return msgs
}

func benchSink(b *testing.B, cfg Config) (*Sink, *kfake.Cluster) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "outbox.order"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	cfg.Brokers = c.ListenAddrs()
	s, err := New(cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s, c
}

// BenchmarkProduce publishes 100,000 1 KB records per op from one goroutine,
// as the relay does, and waits for every acknowledgement. raw-kgo is the same
// through franz-go directly (a closure per record, headers built per record),
// the floor for the sink's own cost; kfake runs in the same process and its
// work and allocations count in every figure.
func BenchmarkProduce(b *testing.B) {
	const n = 100_000
	msgs := benchMessages(n, 1000, 1024)
	for _, bc := range []struct {
		name string
		cfg  Config
	}{
		{"sink", Config{}},
		{"sink/linger=10ms", Config{Linger: 10 * time.Millisecond}},
		{"sink/uncompressed", Config{Opts: []kgo.Opt{kgo.ProducerBatchCompression(kgo.NoCompression())}}},
		{"sink/pipelined", Config{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, _ := benchSink(b, bc.cfg)
			if bc.name == "sink/pipelined" && !s.Pipeline() {
				b.Fatal("the sink did not pipeline")
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(n * len(msgs[0].Envelope)))
			b.ResetTimer()
			for range b.N {
				var acked, failed atomic.Int64
				all := make(chan struct{})
				done := func(_ *relay.Message, err error) {
					if err != nil {
						failed.Add(1)
					}
					if acked.Add(1) == n {
						close(all)
					}
				}
				for _, m := range msgs {
					s.Publish(ctx, m, done)
				}
				<-all
				if f := failed.Load(); f > 0 {
					b.Fatalf("%d records failed", f)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}

	b.Run("raw-kgo", func(b *testing.B) {
		s, _ := benchSink(b, Config{})
		cl := s.client
		ctx := context.Background()
		b.ReportAllocs()
		b.SetBytes(int64(n * len(msgs[0].Envelope)))
		b.ResetTimer()
		for range b.N {
			var acked atomic.Int64
			all := make(chan struct{})
			for _, m := range msgs {
				r := &kgo.Record{
					Topic: "outbox.order",
					Key:   []byte(m.AggregateID),
					Value: m.Envelope,
					Headers: []kgo.RecordHeader{
						{Key: HeaderMessageID, Value: []byte(m.ID)},
						{Key: HeaderEventType, Value: []byte(m.EventType)},
						{Key: HeaderTraceparent, Value: []byte(m.Traceparent)},
						{Key: HeaderContentType, Value: []byte("application/json")},
					},
				}
				cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
					if err != nil {
						b.Error(err)
					}
					if acked.Add(1) == n {
						close(all)
					}
				})
			}
			<-all
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
	})
}

// BenchmarkLatency publishes 1,000 records/s over 50 aggregates for 3 s per op
// and reports the Publish-to-acknowledgement latency, at three lingers and
// pipelined (relay.Pipeliner, as the relay runs the sink). Run it with
// -benchtime=1x. kfake acknowledges acks=all at once (no followers), so a real
// cluster adds its replication time to every figure.
func BenchmarkLatency(b *testing.B) {
	const rate, dur = 1000, 3 * time.Second
	msgs := benchMessages(rate*int(dur/time.Second), 50, 1024)
	for _, c := range []struct {
		linger    time.Duration
		pipelined bool
	}{{0, false}, {5 * time.Millisecond, false}, {10 * time.Millisecond, false}, {0, true}} {
		name := "linger=" + c.linger.String()
		if c.pipelined {
			name = "pipelined"
		}
		b.Run(name, func(b *testing.B) {
			s, _ := benchSink(b, Config{Linger: c.linger})
			if c.pipelined && !s.Pipeline() {
				b.Fatal("the sink did not pipeline")
			}
			ctx := context.Background()
			var lat []time.Duration
			b.ResetTimer()
			for range b.N {
				got := make([]time.Duration, len(msgs))
				var acked atomic.Int64
				all := make(chan struct{})
				start := time.Now()
				interval := time.Second / rate
				for i, m := range msgs {
					if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
						time.Sleep(d)
					}
					t0 := time.Now()
					s.Publish(ctx, m, func(_ *relay.Message, err error) {
						if err != nil {
							b.Error(err)
						}
						got[i] = time.Since(t0)
						if acked.Add(1) == int64(len(msgs)) {
							close(all)
						}
					})
				}
				<-all
				lat = append(lat, got...)
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(0.999), "p99.9-ms")
			b.ReportMetric(q(1), "max-ms")
		})
	}
}

// BenchmarkExactlyOnce publishes 100,000 1 KB records per op in source
// transactions of 10 rows and waits for every acknowledgement: at-least-once
// through Sink, then exactly-once through TxnSink with Kafka transactions of
// at most 100, 1,000 and 10,000 records. Each exactly-once figure is also
// reported as a ratio to the at-least-once one measured in the same run.
func BenchmarkExactlyOnce(b *testing.B) {
	const n, rowsPerTxn = 100_000, 10
	msgs := benchMessages(n, 1000, 1024)
	var reference float64
	publishAll := func(b *testing.B, publish func(*relay.Message, func(*relay.Message, error)), endTxn func(i int)) {
		var acked, failed atomic.Int64
		all := make(chan struct{})
		done := func(_ *relay.Message, err error) {
			if err != nil {
				failed.Add(1)
			}
			if acked.Add(1) == n {
				close(all)
			}
		}
		for i, m := range msgs {
			publish(m, done)
			if (i+1)%rowsPerTxn == 0 {
				endTxn(i)
			}
		}
		<-all
		if f := failed.Load(); f > 0 {
			b.Fatalf("%d records failed", f)
		}
	}
	b.Run("at-least-once", func(b *testing.B) {
		s, _ := benchSink(b, Config{})
		ctx := context.Background()
		b.ResetTimer()
		for range b.N {
			publishAll(b, func(m *relay.Message, done func(*relay.Message, error)) { s.Publish(ctx, m, done) }, func(int) {})
		}
		reference = float64(n*b.N) / b.Elapsed().Seconds()
		b.ReportMetric(reference, "records/s")
	})
	for _, size := range []int{100, 1000, 10_000} {
		b.Run(fmt.Sprintf("exactly-once/txn=%d", size), func(b *testing.B) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "outbox.order"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			s, err := NewTxn(Config{Brokers: c.ListenAddrs(), TransactionalID: "bench", MaxTxnRecords: size}, zap.NewNop())
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { _ = s.Run(ctx); close(ran) }()
			b.Cleanup(func() { cancel(); <-ran; s.Close() })
			if _, err := s.Position(ctx); err != nil {
				b.Fatal(err)
			}
			lsn := uint64(0)
			b.ResetTimer()
			for range b.N {
				publishAll(b, func(m *relay.Message, done func(*relay.Message, error)) { s.Publish(ctx, m, done) },
					func(int) { lsn++; s.EndTxn(cdc.LSN(lsn)) })
			}
			rate := float64(n*b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "records/s")
			if reference > 0 {
				b.ReportMetric(rate/reference, "x-at-least-once")
			}
		})
	}
}
