package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// newCluster starts a one-broker kfake cluster on loopback that creates
// topics on demand, closed when t ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(4),
	}, opts...)...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newSink returns a pinged sink producing to c, closed when t ends.
func newSink(t testing.TB, c *kfake.Cluster, cfg Config) *Sink {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	s, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	return s
}

// createTopic creates topic with the given number of partitions.
func createTopic(t testing.TB, c *kfake.Cluster, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = partitions
	rt.ReplicationFactor = 1
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// consumer reads a topic from its start.
type consumer struct {
	cl  *kgo.Client
	buf []*kgo.Record
}

func newConsumer(t testing.TB, c *kfake.Cluster, topic string) *consumer {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &consumer{cl: cl}
}

// record returns the next record.
func (c *consumer) record(ctx context.Context) (*kgo.Record, error) {
	for len(c.buf) == 0 {
		fs := c.cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c.buf = fs.Records()
	}
	r := c.buf[0]
	c.buf = c.buf[1:]
	return r, nil
}

// records returns the next n records.
func (c *consumer) records(t testing.TB, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for len(rs) < n {
		r, err := c.record(ctx)
		if err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(rs), n, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// Next implements sinktest.Consumer.
func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	r, err := c.record(ctx)
	if err != nil {
		return sinktest.Received{}, err
	}
	got := sinktest.Received{
		Key:     string(r.Key),
		Headers: make(map[string]string, len(r.Headers)),
		Body:    r.Value,
	}
	for _, h := range r.Headers {
		if _, dup := got.Headers[h.Key]; !dup {
			got.Headers[h.Key] = string(h.Value)
		}
		got.All = append(got.All, envelope.Header{Key: h.Key, Value: string(h.Value)})
	}
	got.ID = got.Headers[HeaderMessageID]
	return got, nil
}

// factory runs the shared sink suite against kfake.
type factory struct {
	c   *kfake.Cluster
	cfg Config
}

func (f factory) NewSink(t *testing.T) relay.Sink { return newSink(t, f.c, f.cfg) }

func (f factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	topic := "outbox." + aggregateType
	createTopic(t, f.c, topic, 4)
	return newConsumer(t, f.c, topic)
}

// outcome is what done reported for one message.
type outcome struct {
	m   *relay.Message
	err error
}

// publishOne publishes m and waits for its outcome.
func publishOne(t testing.TB, s *Sink, m *relay.Message) error {
	t.Helper()
	ch := make(chan outcome, 2)
	s.Publish(context.Background(), m, func(m *relay.Message, err error) { ch <- outcome{m, err} })
	select {
	case o := <-ch:
		if o.m != m {
			t.Fatalf("done called with %p, want %p", o.m, m)
		}
		select {
		case <-ch:
			t.Fatal("done called twice")
		case <-time.After(10 * time.Millisecond):
		}
		return o.err
	case <-time.After(30 * time.Second):
		t.Fatal("done not called within 30s")
		return nil
	}
}

// isPermanent reports whether err is a relay.PermanentError.
func isPermanent(err error) bool {
	var p *relay.PermanentError
	return errors.As(err, &p)
}

// checkStoredOnceInOrder consumes as many records as msgs and checks that
// they are msgs, each stored once, in order per aggregate.
func checkStoredOnceInOrder(ctx context.Context, t *testing.T, cons *consumer, msgs []*relay.Message) {
	t.Helper()
	n := len(msgs)
	got := make([]sinktest.Received, 0, n)
	for len(got) < n {
		r, err := cons.Next(ctx)
		if err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(got), n, err)
		}
		got = append(got, r)
	}
	sinktest.CheckOrder(t, msgs, got)
	ids := make(map[string]bool, n)
	for _, r := range got {
		if ids[r.ID] {
			t.Errorf("message %s stored twice", r.ID)
		}
		ids[r.ID] = true
	}
	if len(ids) != n {
		t.Errorf("%d distinct messages stored, want %d", len(ids), n)
	}
}
