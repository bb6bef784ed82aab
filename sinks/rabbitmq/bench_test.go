package rabbitmq

import (
	"bytes"
	"context"
	"fmt"
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
// publisher keeping 1,000 confirms outstanding, and reports msgs/s.

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
	sinktest.BenchmarkPublish(b, s, msgs)
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

	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
