package rabbitmq

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// factory runs the shared sink suite against one exchange: each
// subscription is a queue of its own, bound to the exchange for one
// aggregate type, so it sees only that subtest's messages.
type factory struct{ f *fixture }

func (fa factory) NewSink(t *testing.T) relay.Sink {
	return startSink(t, Config{Exchange: fa.f.exchange})
}

func (fa factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	t.Helper()
	conn, ch := adminChannel(t)
	queue := uniqueName(t) + "-q"
	// Exclusive and auto-deleted: the queue goes with the connection.
	if _, err := ch.QueueDeclare(queue, false, true, true, false, nil); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	key := string(wordEscape.Append(nil, aggregateType)) + ".#"
	if err := ch.QueueBind(queue, key, fa.f.exchange, false, nil); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return consumer{deliveries}
}

type consumer struct{ deliveries <-chan amqp.Delivery }

// Next reports the AMQP properties that carry relay-owned values under the
// relay's header names, so that the suite's one-of-each check covers them.
func (c consumer) Next(ctx context.Context) (sinktest.Received, error) {
	var d amqp.Delivery
	select {
	case <-ctx.Done():
		return sinktest.Received{}, ctx.Err()
	case x, ok := <-c.deliveries:
		if !ok {
			return sinktest.Received{}, fmt.Errorf("the consumer's channel closed")
		}
		d = x
	}
	all := []envelope.Header{
		{Key: "message_id", Value: d.MessageId},
		{Key: "event_type", Value: d.Type},
		{Key: "content-type", Value: d.ContentType},
	}
	h := map[string]string{}
	for k, v := range d.Headers {
		s := fmt.Sprint(v)
		h[k] = s
		all = append(all, envelope.Header{Key: k, Value: s})
	}
	return sinktest.Received{ID: d.MessageId, Key: h["aggregate_id"], Headers: h, Body: d.Body, All: all}, nil
}

func TestSinkSuite(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	sinktest.Run(t, factory{newFixture(t)})
}
