package rabbitmq

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The throughput figures come from
//
//	go test -run '^$' -bench . -benchtime 100000x ./sinks/rabbitmq
//
// which publishes 100,000 persistent 1 KB messages into a durable queue with
// publisher confirms, once through the Sink and once with a bare amqp091
// publisher keeping 1,000 confirms outstanding, and reports msgs/s and the
// test process's CPU time per message (cpu-µs/msg: user and system, read
// with getrusage, so the broker's CPU is not in it). The rate depends on
// the broker and on the machine's load; the CPU per message much less, so
// compare Sink and BareAMQP091 by it:
//
//	go test -run '^$' -bench 'Sink$|BareAMQP091' -benchtime 20000x -count 6 ./sinks/rabbitmq | benchstat -col /name -

const benchInFlight = 1000

var benchBody = bytes.Repeat([]byte("x"), 1024)

func BenchmarkSink(b *testing.B) {
	needBroker(b)
	f := newFixture(b, "#")
	s := startSink(b, Config{Exchange: f.exchange, MaxInFlight: benchInFlight})
	run := uniqueName(b)
	msgs := make([]*relay.Message, b.N)
	for i := range msgs {
		m := testMessage(run, i, i%100, "order")
		m.Envelope = benchBody
		msgs[i] = m
	}
	cpu := startCPU()
	sinktest.BenchmarkPublish(b, s, msgs)
	cpu.report(b)
}

// cpuClock reads the CPU time the process used since it started.
type cpuClock struct{ start time.Duration }

func startCPU() cpuClock { return cpuClock{processCPU()} }

// report adds the process's CPU time per operation since start.
func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(time.Microsecond)/float64(b.N), "cpu-µs/msg")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBareAMQP091 is the baseline: one channel, the same properties,
// NotifyPublish with 1,000 confirms outstanding.
func BenchmarkBareAMQP091(b *testing.B) {
	needBroker(b)
	f := newFixture(b, "#")
	conn, ch := adminChannel(b)
	defer conn.Close()
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2*benchInFlight))
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	run := uniqueName(b)
	pubs := make([]amqp.Publishing, b.N)
	for i := range pubs {
		pubs[i] = amqp.Publishing{
			Headers: amqp.Table{
				"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1), "aggregate_id": fmt.Sprint(i % 100),
				"aggregate_type": "order", "tenant": "acme", "seq": fmt.Sprint(i),
			},
			ContentType: "application/json", DeliveryMode: amqp.Persistent,
			MessageId: fmt.Sprintf("%s-%07d", run, i), Timestamp: time.Now(), Type: "order.created",
			AppId: "outboxrelay", Body: benchBody,
		}
	}
	slots := make(chan struct{}, benchInFlight)
	acked := make(chan error, 1)
	go func() {
		var err error
		for n := 0; n < b.N; n++ {
			c, ok := <-confirms
			if !ok {
				err = fmt.Errorf("channel closed after %d confirms", n)
				break
			}
			if !c.Ack {
				err = fmt.Errorf("nack for tag %d", c.DeliveryTag)
			}
			<-slots
		}
		acked <- err
	}()
	ctx := context.Background()

	b.ResetTimer()
	cpu := startCPU()
	for i := range pubs {
		select {
		case slots <- struct{}{}:
		case err := <-acked: // the connection went away; do not hang
			b.Fatalf("confirms ended after %d publishes: %v", i, err)
		}
		if err := ch.PublishWithContext(ctx, f.exchange, "order.order%2Ecreated", true, false, pubs[i]); err != nil {
			b.Fatal(err)
		}
	}
	err := <-acked
	b.StopTimer()
	cpu.report(b)

	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkPrepare is the sink's own work per message before amqp091
// encodes it: the routing key, the checks, the frame size, and the
// publishing with its header table and delivery tag. It needs no broker;
// allocs/op is exact.
func BenchmarkPrepare(b *testing.B) {
	s, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/", Exchange: "bench"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	m := testMessage("bench", 1, 1, "order")
	m.Envelope = benchBody
	done := func(*relay.Message, error) {}
	b.ReportAllocs()
	tag := uint64(1 << 20) // a tag of a long-lived channel: not a cached small number
	for b.Loop() {
		p, err := s.prepare(m, done)
		if err != nil {
			b.Fatal(err)
		}
		if pub := s.publishing(p, tag); len(pub.Headers) == 0 {
			b.Fatal("no headers")
		}
		tag++
	}
}
