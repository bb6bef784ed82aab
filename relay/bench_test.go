package relay_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
	"github.com/outboxrelay/outboxrelay/sinks/rabbitmq"
)

// streamSource hands the relay n messages over aggregates in transactions of 10.
type streamSource struct {
	contents [][]byte
}

func newStreamSource(n, aggregates int) *streamSource {
	s := &streamSource{}
	for i := range n {
		s.contents = append(s.contents, fmt.Appendf(nil,
			`{"id":"m%d","aggregate_type":"order","aggregate_id":"a%d","event_type":"order.created","payload":{"n":%d,"pad":"%0200d"}}`,
			i, i%aggregates, i, 0))
	}
	return s
}

func (s *streamSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	lsn := cdc.LSN(100)
	for i := 0; i < len(s.contents); {
		_ = h.Begin(ctx, cdc.Begin{FinalLSN: lsn + 20})
		for j := 0; j < 10 && i < len(s.contents); j, i = j+1, i+1 {
			lsn++
			if err := h.Message(ctx, &cdc.LogicalMessage{Transactional: true, LSN: lsn, Prefix: "outboxrelay", Content: s.contents[i]}); err != nil {
				return err
			}
		}
		lsn += 2
		_ = h.Commit(ctx, cdc.Commit{EndLSN: lsn})
	}
	return h.Drain(ctx)
}

// rttSink acknowledges every message rtt after Publish, in Publish order,
// with any number in flight: a broker's round trip and nothing else. It is
// for throughput only, and proves nothing about delivery.
type rttSink struct {
	rtt   time.Duration
	queue chan rttAttempt
}

type rttAttempt struct {
	m    *relay.Message
	at   time.Time
	done func(*relay.Message, error)
}

func (s *rttSink) Publish(_ context.Context, m *relay.Message, done func(*relay.Message, error)) {
	s.queue <- rttAttempt{m, time.Now(), done}
}

func (s *rttSink) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case a := <-s.queue:
			if d := time.Until(a.at.Add(s.rtt)); d > 0 {
				time.Sleep(d)
			}
			a.done(a.m, nil)
		}
	}
}

func (s *rttSink) Ready() bool  { return true }
func (s *rttSink) Close() error { return nil }

// BenchmarkAggregateOrder measures what the per-aggregate order costs: the
// relay publishing through it ("ordered") against the same relay handing
// every message over at once ("pipelined", the reference, run just before in
// the same process). Workloads: 20,000 messages of 20,000 aggregates, of
// 1,000 aggregates, and 2,000 messages of one hot aggregate. "x-pipelined" is
// ordered throughput as a fraction of the reference. Sinks: rttSink with a
// 1 ms round trip, like a broker on a LAN acknowledging once every replica
// has the message, and the Kafka sink over TCP to kfake in the same process
// (a sub-millisecond round trip; kfake's CPU counts). Run with -benchtime=3x.
func BenchmarkAggregateOrder(b *testing.B) {
	sinks := []struct {
		name string
		new  func(b *testing.B) relay.Sink
	}{
		{"rtt=1ms", func(*testing.B) relay.Sink {
			return &rttSink{rtt: time.Millisecond, queue: make(chan rttAttempt, 20_000)}
		}},
		{"kafka", func(b *testing.B) relay.Sink {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "outbox.order"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			s, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs()}, zap.NewNop())
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Ping(context.Background()); err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	workloads := []struct {
		name          string
		n, aggregates int
	}{
		{"aggregates=20000", 20_000, 20_000},
		{"aggregates=1000", 20_000, 1000},
		{"aggregates=1", 2_000, 1},
	}
	for _, sk := range sinks {
		for _, w := range workloads {
			src := newStreamSource(w.n, w.aggregates)
			var reference float64
			for _, ordered := range []bool{false, true} {
				name := sk.name + "/" + w.name + "/pipelined"
				if ordered {
					name = sk.name + "/" + w.name + "/ordered"
				}
				b.Run(name, func(b *testing.B) {
					var elapsed time.Duration
					for range b.N {
						b.StopTimer()
						s := sk.new(b)
						r := relay.New(relay.Config{}, s, nil, relay.Options{})
						if !ordered {
							relay.Unordered(r)
						}
						b.StartTimer()
						start := time.Now()
						if err := r.Run(context.Background(), src); err != nil {
							b.Fatal(err)
						}
						elapsed += time.Since(start)
					}
					rate := float64(w.n*b.N) / elapsed.Seconds()
					b.ReportMetric(rate, "msgs/s")
					if !ordered {
						reference = rate
					} else if reference > 0 {
						b.ReportMetric(rate/reference, "x-pipelined")
					}
				})
			}
		}
	}
}

// BenchmarkKafkaRows is the relay's own work on make bench's 1kb-x100 path
// without PostgreSQL: 20,000 outbox rows of 1 KB payload over 1,000
// aggregates, in transactions of 100, into the Kafka sink (pipelined, as
// the relay runs it) over TCP to kfake in the same process. kfake's CPU
// and allocations count in every figure, so compare runs of it with
// benchstat, not with the bench's ratios. Run with -benchtime=5x -count 6.
func BenchmarkKafkaRows(b *testing.B) {
	const n = 20_000
	data := strings.Repeat("0123456789abcdef", 61)
	src := newRowSource(n, 1000, func(i int) []byte { return fmt.Appendf(nil, `{"seq": %d, "data": "%s"}`, i+1, data) })
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "outbox.order"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	timeRows(b, n, src, func() (relay.Sink, relay.Options, func()) {
		s, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs()}, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Ping(context.Background()); err != nil {
			b.Fatal(err)
		}
		return s, relay.Options{}, func() { _ = s.Close() }
	})
}

// timeRows runs the relay over src, n rows, b.N times, each into the sink
// open returns with the options it returns, and reports msgs/s and
// cpu-µs/msg of the runs alone. open's done runs after each run, outside
// the timing: it closes the sink and checks what it must.
func timeRows(b *testing.B, n int, src *rowSource, open func() (s relay.Sink, opts relay.Options, done func())) {
	b.ReportAllocs()
	var elapsed, cpu time.Duration
	for range b.N {
		b.StopTimer()
		s, opts, done := open()
		r := relay.New(relay.Config{}, s, nil, opts)
		b.StartTimer()
		start, cpu0 := time.Now(), processCPU(b)
		if err := r.Run(context.Background(), src); err != nil {
			b.Fatal(err)
		}
		elapsed, cpu = elapsed+time.Since(start), cpu+processCPU(b)-cpu0
		b.StopTimer()
		done()
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n*b.N), "cpu-µs/msg")
}

// BenchmarkRabbitMQRows is BenchmarkKafkaRows into RabbitMQ: the relay's
// own work on make bench's relay->rabbitmq 1kb-x100 path without
// PostgreSQL (20,000 outbox rows of 1 KB payload over 1,000 aggregates,
// in transactions of 100), through the metrics hooks as internal/app wires
// them, into the RabbitMQ sink over TCP to the broker at 127.0.0.1:5672
// (guest/guest, or $OUTBOXRELAY_BENCH_AMQP_URL): a durable topic exchange
// with one durable queue bound for every key. The broker is another process,
// so cpu-µs/msg is the relay's alone: compare it with sinks/rabbitmq's
// BenchmarkBareAMQP091. Skipped when the broker does not answer. Run with
// -benchtime=5x -count 6.
func BenchmarkRabbitMQRows(b *testing.B) {
	const n = 20_000
	url := cmp.Or(os.Getenv("OUTBOXRELAY_BENCH_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Skipf("RabbitMQ does not answer at %s: %v", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	name := fmt.Sprintf("outboxrelay-bench-rows-%d", time.Now().UnixNano())
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ch.ExchangeDelete(name, false, false) }()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(name, false, false, false) }()
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		b.Fatal(err)
	}

	data := strings.Repeat("0123456789abcdef", 61)
	src := newRowSource(n, 1000, func(i int) []byte { return fmt.Appendf(nil, `{"seq": %d, "data": "%s"}`, i+1, data) })
	timeRows(b, n, src, func() (relay.Sink, relay.Options, func()) {
		if _, err := ch.QueuePurge(name, false); err != nil {
			b.Fatal(err)
		}
		s, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: name}, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Connect(context.Background()); err != nil {
			b.Fatal(err)
		}
		m := metrics.New(metrics.Config{Sink: "rabbitmq"})
		return s, relay.Options{Hooks: m.Hooks()}, func() {
			_ = s.Close()
			if got := m.Acknowledged(); got != n {
				b.Fatalf("%d messages acknowledged, want %d", got, n)
			}
		}
	})
}
