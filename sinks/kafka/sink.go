package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var _ relay.Sink = (*Sink)(nil)

// Header keys the sink sets on every record, before the row's headers
// (see sinks.Binding.Headers for the whole set and its order).
const (
	HeaderMessageID   = sinks.HeaderMessageID
	HeaderEventType   = sinks.HeaderEventType
	HeaderTraceparent = sinks.HeaderTraceparent
	HeaderContentType = sinks.HeaderContentType
)

// Sink publishes relay messages to Kafka. It is safe for concurrent use.
type Sink struct {
	client  *kgo.Client
	brokers []string
	topics  *topics
	log     *zap.Logger
	health  *health
	values  *values // nil for ValueJSON

	// promise is the one produce callback for every record, stored once
	// so that Publish does not allocate a method value per record.
	promise func(*kgo.Record, error)

	// mu orders Publish's registration of a record in inflight against
	// Close, so that Close can wait for every registered record's done.
	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup

	bg sync.WaitGroup // goroutines of topicRecreated

	// opts and maxInFlight rebuild the client for Pipeline; pipe is set
	// by it, before the first Publish (pipeline.go).
	opts        []kgo.Opt
	maxInFlight int
	pipe        *pipeline

	closeOnce sync.Once
}

// New returns a Sink producing with an idempotent franz-go client (acks=all,
// unbounded retries of retryable errors, [Config.Compression], Kafka's key
// hash partitioner). It validates cfg but does not contact the brokers: use
// [Sink.Ping] to check they are reachable. A nil log means zap.NewNop().
//
// franz-go starts its own background goroutines with the client; they stop
// in [Sink.Close].
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tmpl, err := parseTemplate(cfg.Topic, cfg.PositionsTopic)
	if err != nil {
		return nil, err // Validate has checked it
	}
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("kafka")

	s := &Sink{
		brokers: cfg.Brokers,
		topics:  newTopics(tmpl, cfg.PositionsTopic),
		log:     log,
		health:  new(health),

		maxInFlight: cfg.MaxInFlight,
	}
	s.promise = s.produced
	if s.values, err = newValues(cfg); err != nil {
		return nil, err
	}

	opts, err := cfg.producerOpts(log, s.health)
	if err != nil {
		return nil, err
	}
	s.opts = opts
	s.client, err = kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	return s, nil
}

// producerOpts are the options of the producing client: cfg's settings,
// then c.Opts.
func (c Config) producerOpts(log *zap.Logger, h *health) ([]kgo.Opt, error) {
	compression, err := codec(c.Compression)
	if err != nil {
		return nil, err // Validate has checked it
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		kgo.DialTimeout(c.DialTimeout),
		kgo.WithLogger(kzap.New(log)),
		kgo.WithHooks(h),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(c.Linger),
		kgo.MaxBufferedRecords(c.MaxInFlight),
		kgo.ProducerBatchMaxBytes(int32(c.MaxMessageBytes)),
		// Uncompressed is the fallback for brokers that predate the
		// codec's support in the protocol.
		kgo.ProducerBatchCompression(compression, kgo.NoCompression()),
		// As the Java producer does: the broker's
		// auto.create.topics.enable decides whether a missing topic is
		// created.
		kgo.AllowAutoTopicCreation(),
	}
	if c.TLS == nil && c.TLSFiles.Enabled {
		if c.TLS, err = c.TLSFiles.ClientConfig("sink.kafka.tls"); err != nil {
			return nil, err
		}
	}
	if c.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.TLS))
	}
	if m := c.SASL.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	opts = append(opts, c.Opts...)

	return opts, nil
}

// Ping checks that at least one broker answers a metadata request and, with
// a Confluent value format, that the schema registry answers. ctx bounds
// the check. The error names the brokers or the registry and says what to
// fix.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx); err != nil {
		return fmt.Errorf("no kafka broker of %s answered (%w); check sink.kafka.brokers and that the brokers are running and reachable",
			strings.Join(s.brokers, ","), err)
	}
	return s.values.ping(ctx)
}

// pending is one record in flight. One allocation carries the record, the
// inline headers and the relay's message and callback; the record's Context
// is the pending itself, which is how the promise finds them again without a
// map or a per-record closure. The pending is also the record's context:
// the Publish context's values without its cancellation (as
// context.WithoutCancel gives, without an allocation of its own).
//
// A pending is never reused: franz-go may still read a record's Context after
// its promise has returned (the goroutine waiting for an unknown topic keeps
// the first record's), so pooling pendings is a data race.
type pending struct {
	parent context.Context // the Publish context, for its values
	rec    kgo.Record
	m      *relay.Message
	done   func(*relay.Message, error)
	hdrs   [8]kgo.RecordHeader
	// partitioned is set once franz-go has placed the record in a
	// partition buffer; round, when the pipeline produced it in a round.
	partitioned atomic.Bool
	round       bool
	// topic and purges identify the topic's instance the record was
	// produced for: purges is topic.purges at Publish.
	topic  *topicState
	purges uint64
}

// Publish renders m's topic, sets m.Destination to it and produces m
// asynchronously; done is called exactly once, possibly before Publish
// returns, from a franz-go goroutine otherwise. Callbacks run one at a time
// on that goroutine, so done must not block, nor call Publish (which can
// block on a full buffer that only that goroutine drains).
//
// done receives nil once every in-sync replica has the record, a
// relay.Permanent error when the topic is not a legal Kafka topic name or
// one no row may address (the positions topic, Kafka's __ topics), or the
// key or a header is not valid UTF-8 (nothing is produced), or the broker
// rejects the record for good (see produceError), and a retryable error
// otherwise: ctx cancelled before
// Publish handed the record over, or the sink closed. Once handed over, the
// record no longer depends on ctx. Publish blocks while
// Config.MaxInFlight records are unacknowledged, until one is or ctx
// is cancelled. Records with the same AggregateID are sent in the order of
// the Publish calls.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	t := s.topics.render(m)
	m.Destination = t.topic
	if t.err != nil {
		s.reject(m, done, relay.Permanent(t.err))
		return
	}
	if err := ctx.Err(); err != nil {
		s.reject(m, done, err)
		return
	}

	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		done(m, fmt.Errorf("produce to kafka topic %q: %w", t.topic, kgo.ErrClientClosed))
		return
	}
	s.inflight.Add(1)
	s.mu.RUnlock()

	val, ct, err := s.values.encode(ctx, t.topic, m)
	if err != nil {
		s.reject(m, done, err)
		s.inflight.Done()
		return
	}
	p, err := newPending(ctx, m, done, t, val, ct)
	if err != nil {
		s.reject(m, done, relay.Permanent(err))
		s.inflight.Done()
		return
	}
	if s.pipe != nil {
		s.pipe.enqueue(p)
		return
	}
	r := &p.rec
	s.client.Produce(ctx, r, s.promise)
}

// reject reports err for m, which is not produced; pipelined, it holds m's
// aggregate (relay.Pipeliner).
func (s *Sink) reject(m *relay.Message, done func(*relay.Message, error), err error) {
	if s.pipe != nil {
		s.pipe.hold(m)
	}
	done(m, err)
}

// finish reports err for p, queued by the pipeline but not produced, and
// holds its aggregate.
func (s *Sink) finish(p *pending, err error) {
	s.reject(p.m, p.done, err)
	s.inflight.Done()
}

// finishCounted is finish for p counted in the pipeline's out (queued).
func (s *Sink) finishCounted(p *pending, err error) {
	s.pipe.settled(p)
	s.finish(p, err)
}

// newPending builds the record of m for the rendered topic t. A non-nil val
// is the record value instead of m.Envelope, of the content type ct. It
// fails when the key (aggregate_id) or a header is not valid UTF-8: the
// value's envelope would carry U+FFFD where the key and headers carry the
// raw bytes, so no such record is produced (see sinks.CheckUTF8).
func newPending(ctx context.Context, m *relay.Message, done func(*relay.Message, error), t topicResult, val []byte, ct string) (*pending, error) {
	key, what := m.AggregateID, "kafka record key (aggregate_id)"
	if m.Key != "" && m.Key != m.AggregateID {
		key, what = m.Key, "kafka record key (postgres.columns.key)"
	}
	if err := sinks.CheckUTF8(what, key); err != nil {
		return nil, err
	}
	// The record outlives the call: franz-go fails a buffered record whose
	// context ends, and a relay shutting down (ctx cancelled) still wants
	// what it handed over to be acknowledged while it drains. Close ends it.
	p := &pending{parent: ctx, m: m, done: done, topic: t.state}
	if t.state != nil {
		p.purges = t.state.purges.Load()
	}
	r := &p.rec
	r.Context = p
	r.Topic = t.topic
	r.Key = bytesOf(key)
	r.Value = m.Envelope
	if m.Tombstone {
		r.Value = nil // a null value, as Debezium's router sends an empty payload
	}
	if !m.Timestamp.IsZero() {
		r.Timestamp = m.Timestamp
	}
	hm := m
	if val != nil {
		r.Value = val
		c := *m
		c.ContentType = ct
		hm = &c
	}
	var own [16]envelope.Header
	hs, _ := sinks.Kafka.Headers(own[:0], hm)
	if err := sinks.CheckHeaders(hs); err != nil {
		return nil, err
	}
	h := p.hdrs[:0]
	for _, x := range hs {
		h = append(h, kgo.RecordHeader{Key: x.Key, Value: bytesOf(x.Value)})
	}
	r.Headers = h

	return p, nil
}

var _ context.Context = (*pending)(nil)

// Deadline implements context.Context: none.
func (*pending) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context: never.
func (*pending) Done() <-chan struct{} { return nil }

// Err implements context.Context: never cancelled.
func (*pending) Err() error { return nil }

// Value implements context.Context: the Publish context's values.
func (p *pending) Value(key any) any { return p.parent.Value(key) }

// produced is the promise of every record.
func (s *Sink) produced(r *kgo.Record, err error) {
	p := r.Context.(*pending)
	if err != nil && errors.Is(err, kerr.UnknownTopicID) {
		s.topicRecreated(r.Topic, p)
	}
	m, done := p.m, p.done
	err = produceError(r.Topic, err)
	if err != nil && s.pipe != nil {
		err = s.pipe.failed(p, r, err)
	}
	if s.pipe != nil {
		s.pipe.settled(p)
	}
	done(m, err)
	s.inflight.Done()
	if p.round {
		s.pipe.round.Done()
	}
}

// topicRecreated handles UNKNOWN_TOPIC_ID: franz-go saw the topic deleted and
// recreated and fails every record for it from then on, until the topic is
// purged from the producer. The relay retries the records (the error is
// retryable); purging lets the retries reach the new topic.
//
// The topic is purged once per instance: a record failed for an instance
// already purged, or produced while a purge was running, does not purge
// again, which would fail records already sent to the new instance.
// topicState.purges is odd while a purge runs.
//
// On brokers before Kafka 4.1, records produced while a topic is recreated
// may land out of order or twice in the new topic; see franz-go's README.
func (s *Sink) topicRecreated(topic string, p *pending) {
	st := p.topic
	if st != nil && (p.purges%2 == 1 || !st.purges.CompareAndSwap(p.purges, p.purges+1)) {
		return
	}
	s.log.Warn("kafka topic was deleted and recreated; producing to the new topic from now on", zap.String("topic", topic))
	// Purging waits for franz-go's metadata loop, which can be waiting
	// on this promise goroutine: purge from a goroutine of our own. Close
	// waits for it after every promise has run, so none is started
	// after Close.
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.client.PurgeTopicsFromProducing(topic)
		if st != nil {
			st.purges.Add(1)
		}
	}()
}

// bytesOf returns s as a byte slice without copying. franz-go only reads
// record keys and header values, and the record is released before done is
// called, so the string's bytes are never written. An empty s gives a
// non-nil empty slice: an empty aggregate_id is an empty key, not a null one.
func bytesOf(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// Ready reports whether the latest round trip to a broker succeeded: it is
// false before the first one (call Ping), while connections fail and after
// Close. It does not block. With several brokers, one unreachable broker
// makes it flip with each attempt to reach that broker.
func (s *Sink) Ready() bool {
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	return !closed && s.health.ready()
}

// Close closes the client. Every record not yet acknowledged is reported
// through its done as a retryable error (franz-go's ErrClientClosed); one
// that was already sent may still have been written, so republishing it can
// duplicate it, which at-least-once delivery allows. Every done has been
// called when Close returns. Close is safe to call once publishing has
// stopped, and more than once.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.client.Close()
		if s.pipe != nil {
			s.pipe.close()
		}
		s.inflight.Wait()
		s.bg.Wait()
	})
	return nil
}

// health tracks broker round trips through franz-go hooks. Events are
// ordered by a counter rather than the clock.
type health struct {
	seq       atomic.Uint64
	good, bad atomic.Uint64 // seq of the latest successful / failed round trip
}

var (
	_ kgo.HookBrokerConnect = (*health)(nil)
	_ kgo.HookBrokerE2E     = (*health)(nil)
)

func (h *health) ready() bool { return h.good.Load() > h.bad.Load() }

func (h *health) record(err error) {
	n := h.seq.Add(1)
	latest := &h.good
	if err != nil {
		latest = &h.bad
	}
	// Hooks run on many goroutines: never move latest backwards.
	for {
		old := latest.Load()
		if old >= n || latest.CompareAndSwap(old, n) {
			return
		}
	}
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h *health) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	h.record(err)
}

// OnBrokerE2E implements kgo.HookBrokerE2E.
func (h *health) OnBrokerE2E(_ kgo.BrokerMetadata, _ int16, e2e kgo.BrokerE2E) {
	h.record(e2e.Err())
}
