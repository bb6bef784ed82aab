package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// The spoofing row of the interoperability issue: every header but tenant
// is named like one the relay owns.
const (
	spoofHeaders = `{"message_id":"SPOOFED","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",` +
		`"content-type":"text/evil","ce_id":"x","id":"SPOOFED","tenant":"acme"}`
	spoofRowTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// wireMessage is one broker message as a stock consumer of that broker sees
// it: every header (Kafka, NATS, AMQP) or field (Redis) in wire order with
// repeats kept. AMQP properties that carry relay-owned values are listed
// under the relay's header names.
type wireMessage struct {
	headers []envelope.Header
	body    []byte
}

func (w wireMessage) values(name string) []string {
	var vs []string
	for _, h := range w.headers {
		if strings.EqualFold(h.Key, name) {
			vs = append(vs, h.Value)
		}
	}
	return vs
}

// reservedBroker is one sink as the test drives it: the sink section of
// the relay's configuration, the CloudEvents prefix of its binding, and a
// reader of what arrived.
type reservedBroker struct {
	name     string
	prefix   string
	sinkYAML func(t *testing.T, e *env) (yaml string, read func(t *testing.T, n int) []wireMessage)
}

func reservedBrokers() []reservedBroker {
	return []reservedBroker{
		{name: "kafka", prefix: "ce_", sinkYAML: func(t *testing.T, e *env) (string, func(*testing.T, int) []wireMessage) {
			return fmt.Sprintf("  kafka:\n    brokers: [%s]\n", e.brokers), func(t *testing.T, n int) []wireMessage {
				return readKafkaRaw(t, e.brokers, "outbox.order", n)
			}
		}},
		{name: "rabbitmq", prefix: "cloudEvents:", sinkYAML: func(t *testing.T, e *env) (string, func(*testing.T, int) []wireMessage) {
			q, _ := rabbitEnv(t, "#")
			return fmt.Sprintf("  rabbitmq:\n    url: %s\n    exchange: %s\n", rabbitURL, q.exchange), func(t *testing.T, n int) []wireMessage {
				deadline := time.Now().Add(30 * time.Second)
				for {
					q.mu.Lock()
					got := len(q.got)
					q.mu.Unlock()
					if got >= n || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				q.mu.Lock()
				defer q.mu.Unlock()
				var out []wireMessage
				for _, d := range q.got {
					w := wireMessage{body: d.Body, headers: []envelope.Header{
						{Key: "message_id", Value: d.MessageId}, {Key: "event_type", Value: d.Type},
						{Key: "content-type", Value: d.ContentType},
					}}
					for k, v := range d.Headers {
						w.headers = append(w.headers, envelope.Header{Key: k, Value: fmt.Sprint(v)})
					}
					out = append(out, w)
				}
				return out
			}
		}},
		{name: "nats", prefix: "ce-", sinkYAML: func(t *testing.T, e *env) (string, func(*testing.T, int) []wireMessage) {
			pgservertest.RequireTCP(t, "127.0.0.1:4222", "nats-server with JetStream (nats-server -js)")
			id := extraID()
			stream, subject := "RESERVED_"+strings.ToUpper(id), "reserved"+id
			nc, err := natsgo.Connect("nats://127.0.0.1:4222")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
			yaml := fmt.Sprintf("  nats:\n    url: nats://127.0.0.1:4222\n    subject: \"%s.{aggregate_type}\"\n    stream: %s\n    create_stream: true\n", subject, stream)
			return yaml, func(t *testing.T, n int) []wireMessage {
				waitNATS(t, js, stream, uint64(n))
				c, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
				if err != nil {
					t.Fatal(err)
				}
				batch, err := c.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				var out []wireMessage
				for m := range batch.Messages() {
					w := wireMessage{body: m.Data()}
					for k, vs := range m.Headers() {
						for _, v := range vs {
							w.headers = append(w.headers, envelope.Header{Key: k, Value: v})
						}
					}
					out = append(out, w)
				}
				return out
			}
		}},
		{name: "redis", prefix: "ce_", sinkYAML: func(t *testing.T, e *env) (string, func(*testing.T, int) []wireMessage) {
			pgservertest.RequireTCP(t, "127.0.0.1:6379", "Redis")
			key := "outboxrelay-reserved:" + extraID()
			rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
			t.Cleanup(func() { rdb.Del(context.Background(), key); rdb.Close() })
			return fmt.Sprintf("  redis:\n    url: redis://127.0.0.1:6379/0\n    stream: %q\n", key), func(t *testing.T, n int) []wireMessage {
				deadline := time.Now().Add(30 * time.Second)
				for {
					if got, _ := rdb.XLen(t.Context(), key).Result(); got >= int64(n) || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				// XRANGE by hand: go-redis's XMessage.Values is a map and
				// would hide a repeated field.
				raw, err := rdb.Do(t.Context(), "XRANGE", key, "-", "+").Slice()
				if err != nil {
					t.Fatal(err)
				}
				var out []wireMessage
				for _, entry := range raw {
					fields := entry.([]any)[1].([]any)
					var w wireMessage
					for i := 0; i+1 < len(fields); i += 2 {
						k, v := fmt.Sprint(fields[i]), fmt.Sprint(fields[i+1])
						if k == "envelope" {
							w.body = []byte(v)
							continue
						}
						w.headers = append(w.headers, envelope.Header{Key: k, Value: v})
					}
					out = append(out, w)
				}
				return out
			}
		}},
	}
}

// readKafkaRaw reads n records of topic from the start, every header kept.
func readKafkaRaw(t *testing.T, brokers, topic string, n int) []wireMessage {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []wireMessage
	for len(out) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			w := wireMessage{body: r.Value}
			for _, h := range r.Headers {
				w.headers = append(w.headers, envelope.Header{Key: h.Key, Value: string(h.Value)})
			}
			out = append(out, w)
		})
	}
	return out
}

// TestReservedHeadersEveryBroker: a row whose headers spoof the relay's own
// (message_id, traceparent, content-type, a CloudEvents attribute, id) reaches
// each of the four brokers through the relay binary with exactly one of
// each relay-owned header, carrying the relay's value, and with its other
// headers (tenant) passed on; in cloudevents-binary format the attributes
// travel once each with the binding's prefix, and the content type is the
// payload's; in debezium format the id header is the relay's message id.
func TestReservedHeadersEveryBroker(t *testing.T) {
	for _, format := range []string{"envelope", "cloudevents-binary", "debezium"} {
		for _, b := range reservedBrokers() {
			t.Run(b.name+"/"+format, func(t *testing.T) {
				e := newEnv(t)
				sinkYAML, read := b.sinkYAML(t, e)
				p := e.startConfig(fmt.Sprintf(`postgres:
  url: %s
  status_interval: 200ms
sink:
  type: %s
%senvelope:
  format: %s
  source: /shop/orders
http:
  listen: 127.0.0.1:0
log:
  level: info
`, e.dbURL, b.name, sinkYAML, format))
				p.waitLog(`"streaming"`, 30*time.Second)
				ids := map[string]string{} // id -> aggregate id
				for _, agg := range []string{"1", "2"} {
					var id string
					if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, traceparent)
						VALUES ('order', $1, 'order.created', '{"order_id": 42}', $2, $3) RETURNING id::text`,
						agg, spoofHeaders, spoofRowTraceparent).Scan(&id); err != nil {
						t.Fatal(err)
					}
					ids[id] = agg
				}
				got := read(t, len(ids))
				seen := map[string]int{}
				for _, w := range got {
					id := strings.Join(w.values("message_id"), ",")
					seen[id]++
					checkReserved(t, b, format, w, id, ids[id])
				}
				for id := range ids {
					if seen[id] != 1 {
						t.Errorf("message %s arrived %d times, want once", id, seen[id])
					}
				}
				if len(seen) != len(ids) {
					t.Errorf("received messages %v, want exactly %d", seen, len(ids))
				}
				p.waitLog("dropped row headers whose names the relay owns", 10*time.Second)
				p.stop()
			})
		}
	}
}

func checkReserved(t *testing.T, b reservedBroker, format string, w wireMessage, id, agg string) {
	t.Helper()
	want := map[string]string{
		"message_id": id, "event_type": "order.created", "traceparent": spoofRowTraceparent,
		"content-type": "application/json",
	}
	if b.name != "kafka" { // Kafka carries the aggregate id as the record key
		want["aggregate_id"], want["aggregate_type"] = agg, "order"
	}
	if format == "debezium" {
		want["id"] = id
	}
	if format == "cloudevents-binary" {
		for k, v := range map[string]string{"id": id, "source": "/shop/orders", "type": "order.created",
			"specversion": "1.0", "subject": agg, "traceparent": spoofRowTraceparent} {
			want[b.prefix+k] = v
		}
	}
	for name, v := range want {
		if got := w.values(name); len(got) != 1 || got[0] != v {
			t.Errorf("%s: message %s: %s = %q, want exactly one %q", b.name, id, name, got, v)
		}
	}
	for _, h := range w.headers {
		if h.Value == "SPOOFED" || h.Value == "text/evil" || h.Value == "x" ||
			strings.Contains(h.Value, "0af7651916cd43dd8448eb211c80319c") && h.Key != "headers" {
			t.Errorf("%s: message %s: header %s carries the row's spoofed value %q", b.name, id, h.Key, h.Value)
		}
		if strings.EqualFold(h.Key, b.prefix+"datacontenttype") {
			t.Errorf("%s: message %s: datacontenttype sent as %s; the binding carries it in the content type", b.name, id, h.Key)
		}
		if format != "cloudevents-binary" && envelope.Reserved(h.Key) && strings.HasPrefix(strings.ToLower(h.Key), strings.ToLower(b.prefix)) {
			t.Errorf("%s: message %s: CloudEvents header %s in %s format", b.name, id, h.Key, format)
		}
	}
	// Redis carries the row's headers as one JSON field; every other broker
	// as headers of their own.
	if b.name == "redis" {
		if hs := w.values("headers"); len(hs) != 1 || hs[0] != `{"tenant":"acme"}` {
			t.Errorf("redis: message %s: headers field %q, want only tenant", id, hs)
		}
	} else if got := w.values("tenant"); len(got) != 1 || got[0] != "acme" {
		t.Errorf("%s: message %s: tenant = %q, want exactly one acme", b.name, id, got)
	}
}
