package rabbitmq

import (
	"context"
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkBareChannels tells whether a bare amqp091 publisher is limited by
// its channel or by the queue: persistent 1 KB messages into one durable
// queue (classic or quorum) from 1, 2 and 4 channels of one connection, each
// with its own 1,000 confirms outstanding (the relay's budget, split), and
// reports msgs/s. If two channels publish no faster than one, the queue
// process is the limit and more channels in the relay would not help.
//
//	go test -run '^$' -bench BareChannels -benchtime 50000x -count 3 ./sinks/rabbitmq
func BenchmarkBareChannels(b *testing.B) {
	for _, qt := range []string{"classic", "quorum"} {
		for _, n := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%s/channels=%d", qt, n), func(b *testing.B) { benchChannels(b, qt, n) })
		}
	}
}

func benchChannels(b *testing.B, queueType string, channels int) {
	needBroker(b)
	conn, admin := adminChannel(b)
	defer conn.Close()
	queue := uniqueName(b)
	if _, err := admin.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": queueType}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_, _ = admin.QueueDelete(queue, false, false, false)
	}()
	pub := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Type: "order.created", AppId: "outboxrelay", Body: benchBody}
	ctx := context.Background()
	errs := make(chan error, channels)
	var wg sync.WaitGroup
	b.ResetTimer()
	for c := range channels {
		share := b.N / channels
		if c == 0 {
			share += b.N % channels
		}
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		inFlight := benchInFlight / channels
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2*inFlight))
		wg.Go(func() {
			slots := make(chan struct{}, inFlight)
			acked := make(chan error, 1)
			go func() {
				for n := 0; n < share; n++ {
					c, ok := <-confirms
					if !ok {
						acked <- fmt.Errorf("channel closed after %d confirms", n)
						return
					}
					if !c.Ack {
						acked <- fmt.Errorf("nack for tag %d", c.DeliveryTag)
						return
					}
					<-slots
				}
				acked <- nil
			}()
			for i := range share {
				select {
				case slots <- struct{}{}:
				case err := <-acked:
					errs <- fmt.Errorf("confirms ended after %d publishes: %v", i, err)
					return
				}
				if err := ch.PublishWithContext(ctx, "", queue, true, false, pub); err != nil {
					errs <- err
					return
				}
			}
			errs <- <-acked
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
