package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ relay.Transactional = (*TxnSink)(nil)
	_ relay.Runner        = (*TxnSink)(nil)
)

// TransactionalID is the transactional.id the command gives exactly-once
// mode when sink.kafka.transactional_id is empty: every relay on the slot
// shares it, so the one that starts a session fences off the others.
func TransactionalID(slot string) string { return "outboxrelay-" + slot }

// TxnSink is the exactly-once Kafka sink: a transactional producer. Each
// Kafka transaction holds the records of one or more whole source
// transactions and, in the same transaction, a record in
// Config.PositionsTopic keyed by the transactional.id, with a
// [PositionHeader] naming it too, whose value is the commit LSN of the last
// of them. No message can be produced to that topic (or to any __ topic),
// and the reader ignores records without the header once there is one
// with it. A consumer reading with
// isolation.level=read_committed sees the records of a transaction exactly
// when the position that covers them is committed, so a relay that resumes
// after the position ([TxnSink.Position]) repeats nothing and loses nothing.
//
// Messages are reported acknowledged once their Kafka transaction is
// committed. When a transaction fails, or its outcome is unknown (the
// broker went away during the commit), the sink starts a new producer
// session, which aborts whatever the old one left open, reads the position
// back and commits again only the source transactions beyond it. Another
// producer with the same transactional.id (a standby that took over)
// fences this one off: Run then returns an error and the relay stops.
//
// Safe for concurrent use.
type TxnSink struct {
	cfg    Config
	opts   []kgo.Opt
	log    *zap.Logger
	health *health
	topics *topics
	values *values // nil for ValueJSON
	kick   chan struct{}

	clientMu sync.Mutex
	client   *kgo.Client // replaced when a transaction fails

	mu    sync.Mutex
	open  []*pending // published since the last EndTxn
	ready []part     // whole source transactions not yet committing

	run *sinks.Lifecycle // stopped by Close under mu
}

// part is the records of one source transaction and its commit LSN.
type part struct {
	recs []*pending
	lsn  cdc.LSN
}

// NewTxn returns an exactly-once sink. It validates cfg (which needs a
// TransactionalID) but does not contact the brokers.
func NewTxn(cfg Config, log *zap.Logger) (*TxnSink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TransactionalID == "" {
		return nil, errors.New("sink.kafka.transactional_id is empty; set it, or run the relay through the command, which derives it from postgres.slot")
	}
	cfg = cfg.withDefaults()
	tmpl, err := parseTemplate(cfg.Topic, cfg.PositionsTopic)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("kafka")
	s := &TxnSink{cfg: cfg, log: log, health: new(health), topics: newTopics(tmpl, cfg.PositionsTopic), kick: make(chan struct{}, 1), run: sinks.NewLifecycle("kafka")}
	if s.values, err = newValues(cfg); err != nil {
		return nil, err
	}
	opts, err := cfg.producerOpts(log, s.health)
	if err != nil {
		return nil, err
	}
	s.opts = append(opts, kgo.TransactionalID(cfg.TransactionalID))
	if s.client, err = kgo.NewClient(s.opts...); err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	return s, nil
}

// Ping checks that at least one broker answers a metadata request and, with
// a Confluent value format, that the schema registry answers.
func (s *TxnSink) Ping(ctx context.Context) error {
	if err := s.current().Ping(ctx); err != nil {
		return fmt.Errorf("no kafka broker of %v answered (%w); check sink.kafka.brokers and that the brokers are running and reachable", s.cfg.Brokers, err)
	}
	return s.values.ping(ctx)
}

func (s *TxnSink) current() *kgo.Client {
	s.clientMu.Lock()
	defer s.clientMu.Unlock()
	return s.client
}

// Publish renders m's topic and holds m until EndTxn ends its source
// transaction; done is called once the Kafka transaction holding m has
// committed, or with a relay.Permanent error, before Publish returns, when
// the topic is not a legal name or one no row may address (above all
// Config.PositionsTopic), or the key or a header is not valid UTF-8.
func (s *TxnSink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	t := s.topics.render(m)
	m.Destination = t.topic
	if t.err != nil {
		done(m, relay.Permanent(t.err))
		return
	}
	val, ct, err := s.values.encode(ctx, t.topic, m)
	if err != nil {
		done(m, err)
		return
	}
	p, err := newPending(ctx, m, done, t, val, ct)
	if err != nil {
		done(m, relay.Permanent(err))
		return
	}
	s.mu.Lock()
	if s.run.Stopped() {
		s.mu.Unlock()
		done(m, fmt.Errorf("produce to kafka topic %q: %w", t.topic, kgo.ErrClientClosed))
		return
	}
	s.open = append(s.open, p)
	s.mu.Unlock()
}

// EndTxn implements relay.Transactional.
func (s *TxnSink) EndTxn(commitLSN cdc.LSN) {
	s.mu.Lock()
	if len(s.open) > 0 {
		s.ready = append(s.ready, part{recs: s.open, lsn: commitLSN})
		s.open = nil
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run commits the ended source transactions, a batch of them per Kafka
// transaction, until ctx ends or Close is called (nil), or the producer is
// fenced off (an error naming the cause).
func (s *TxnSink) Run(ctx context.Context) error {
	if err := s.run.Enter(); err != nil {
		return err
	}
	defer s.run.Exit()
	ctx, cancel := s.run.Context(ctx)
	defer cancel()
	for {
		batch := s.take()
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-s.kick:
			}
			continue
		}
		if err := s.commit(ctx, batch); err != nil {
			// A fence is reported even when a stop came meanwhile: commit
			// reported the batch failed before it returned, and a caller
			// that saw those outcomes and stopped must still learn why.
			if ctx.Err() != nil && !fenced(err) {
				return nil
			}
			return err
		}
	}
}

// take removes the oldest ended source transactions, up to
// Config.MaxTxnRecords records (at least one transaction).
func (s *TxnSink) take() []part {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, recs := 0, 0
	for n < len(s.ready) && (n == 0 || recs+len(s.ready[n].recs) <= s.cfg.MaxTxnRecords) {
		recs += len(s.ready[n].recs)
		n++
	}
	batch := s.ready[:n:n]
	s.ready = s.ready[n:]
	return batch
}

// txnRetryMin and txnRetryMax bound the pause before a new producer
// session after a failed transaction: 200ms after the first failure,
// doubling up to 10s, with jitter (internal/backoff).
const txnRetryMin, txnRetryMax = 100 * time.Millisecond, 10 * time.Second

// commit writes batch in one Kafka transaction, again and again until it
// is committed, and reports its messages acknowledged. On cancellation or
// fencing it reports them failed and returns the error.
func (s *TxnSink) commit(ctx context.Context, batch []part) error {
	for attempt := 1; ; attempt++ {
		err := s.transact(ctx, s.current(), batch)
		if err == nil {
			report(batch, nil)
			return nil
		}
		if ctx.Err() == nil && fenced(err) {
			err = fmt.Errorf("another relay with transactional.id %q took over the slot and fenced this one off (%w); stopping", s.cfg.TransactionalID, err)
		}
		if ctx.Err() != nil || fenced(err) {
			report(batch, fmt.Errorf("kafka transaction: %w", err))
			return err
		}
		s.log.Warn("kafka transaction failed; starting a new producer session and committing again what Kafka does not hold",
			zap.Int("attempt", attempt), zap.Error(err))
		for {
			if !sinks.Sleep(ctx, backoff.Delay(txnRetryMin, txnRetryMax, attempt+1)) {
				report(batch, ctx.Err())
				return ctx.Err()
			}
			pos, err := s.restart(ctx)
			if err == nil {
				batch = trim(batch, pos)
				break
			}
			if fenced(err) {
				report(batch, err)
				return err
			}
			s.log.Warn("read the position back from kafka", zap.Error(err))
			attempt++
		}
		if len(batch) == 0 {
			return nil
		}
	}
}

// trim reports the parts at or below pos acknowledged (committed by an
// earlier attempt whose outcome was unknown) and returns the others.
func trim(batch []part, pos cdc.LSN) []part {
	i := 0
	for i < len(batch) && batch[i].lsn <= pos {
		i++
	}
	report(batch[:i], nil)
	return batch[i:]
}

func report(batch []part, err error) {
	for _, pt := range batch {
		for _, p := range pt.recs {
			p.done(p.m, err)
		}
	}
}

// transact produces batch and its position in one Kafka transaction.
func (s *TxnSink) transact(ctx context.Context, cl *kgo.Client, batch []part) error {
	if err := cl.BeginTransaction(); err != nil {
		return err
	}
	var mu sync.Mutex
	var first error
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
	}
	for _, pt := range batch {
		for _, p := range pt.recs {
			// A fresh record per attempt: franz-go writes into the ones it produces.
			r := new(kgo.Record)
			*r = p.rec
			cl.Produce(ctx, r, promise)
		}
	}
	pos := batch[len(batch)-1].lsn
	cl.Produce(ctx, s.positionRecord(pos), promise)
	err := cl.Flush(ctx)
	mu.Lock()
	err = errors.Join(err, first)
	mu.Unlock()
	if err != nil {
		abortCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = cl.EndTransaction(abortCtx, kgo.TryAbort)
		return err
	}
	return cl.EndTransaction(ctx, kgo.TryCommit)
}

// PositionHeader names the header of the relay's position records: its
// value is the transactional.id that wrote the record. Its prefix is
// reserved (envelope.Reserved), so no row can carry it.
const PositionHeader = "x-outboxrelay-position-of"

// positionRecord is the record of position pos: keyed by the
// transactional.id, the PositionHeader naming it too, and the LSN in the
// relay's form (pglogrepl.LSN.String, upper-case hex) as the value.
func (s *TxnSink) positionRecord(pos cdc.LSN) *kgo.Record {
	id := []byte(s.cfg.TransactionalID)
	return &kgo.Record{Topic: s.cfg.PositionsTopic, Key: id, Value: []byte(pos.String()),
		Headers: []kgo.RecordHeader{{Key: PositionHeader, Value: id}}}
}

// positionOf returns the position r records for the transactional.id id.
// own is true for a record written by this version of the relay, false for
// one written before position records had the PositionHeader (the key and
// the value only); ok is false for any other record, which the reader
// ignores: a control record, another id's, one not written in a
// transaction (the relay writes positions only in its transactions), or one
// whose value is not an LSN in the relay's form.
func positionOf(r *kgo.Record, id string) (lsn cdc.LSN, own, ok bool) {
	if r.Attrs.IsControl() || !r.Attrs.IsTransactional() || string(r.Key) != id {
		return 0, false, false
	}
	switch len(r.Headers) {
	case 0:
	case 1:
		if h := r.Headers[0]; h.Key != PositionHeader || string(h.Value) != id {
			return 0, false, false
		}
		own = true
	default:
		return 0, false, false
	}
	parsed, err := pglogrepl.ParseLSN(string(r.Value))
	if err != nil || parsed.String() != string(r.Value) {
		return 0, false, false
	}
	return parsed, own, true
}

// restart replaces the client by a new producer session and reads the
// position back.
func (s *TxnSink) restart(ctx context.Context) (cdc.LSN, error) {
	cl, err := kgo.NewClient(s.opts...)
	if err != nil {
		return 0, fmt.Errorf("create kafka client: %w", err)
	}
	s.clientMu.Lock()
	old := s.client
	s.client = cl
	s.clientMu.Unlock()
	old.Close()
	return s.position(ctx, cl)
}

// fenced reports whether err says that a newer producer with the same
// transactional.id exists.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// Position implements relay.Transactional: it starts this producer's
// session (InitProducerID), which aborts a transaction an earlier relay
// with the same transactional.id left open and fences that relay off, and
// then reads the newest position committed for the transactional.id.
func (s *TxnSink) Position(ctx context.Context) (cdc.LSN, error) {
	return s.position(ctx, s.current())
}

func (s *TxnSink) position(ctx context.Context, cl *kgo.Client) (cdc.LSN, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return 0, fmt.Errorf("start the kafka producer session of transactional.id %q: %w", s.cfg.TransactionalID, err)
	}
	adm := kadm.NewClient(cl)
	topic := s.cfg.PositionsTopic
	compact := "compact"
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, topic); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return 0, fmt.Errorf("create kafka topic %q: %w", topic, err)
	}
	// The last stable offset: with this session started, no earlier
	// session's transaction is still open, so it is the end of the log.
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("list the end offsets of kafka topic %q: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("list the start offsets of kafka topic %q: %w", topic, err)
	}
	want := map[int32]kgo.Offset{}
	last := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		start, _ := starts.Lookup(topic, o.Partition)
		if o.Offset > start.Offset {
			want[o.Partition] = kgo.NewOffset().At(start.Offset)
			last[o.Partition] = o.Offset - 1
		}
	})
	if len(want) == 0 {
		return 0, nil
	}
	copts, err := s.cfg.ClientOpts()
	if err != nil {
		return 0, err
	}
	rd, err := kgo.NewClient(append(copts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: want}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Commit markers count as read: the last offset before the end is one.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		return 0, fmt.Errorf("create kafka client: %w", err)
	}
	defer rd.Close()
	// Per partition, the newest record of the relay's own (own), and the
	// newest one written before position records were marked (legacy): a
	// relay writes its positions in increasing order, the newest last.
	// Legacy records count only in a partition that has no marked one, so
	// that a relay upgraded to marked records resumes where it stopped.
	type newest struct {
		own, legacy       cdc.LSN
		hasOwn, hasLegacy bool
	}
	found := map[int32]*newest{}
	ignored := 0
	for len(last) > 0 {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("read kafka topic %q: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return 0, fmt.Errorf("read kafka topic %q: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := last[r.Partition]; ok && r.Offset >= end {
				delete(last, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			lsn, own, ok := positionOf(r, s.cfg.TransactionalID)
			if !ok {
				if string(r.Key) == s.cfg.TransactionalID {
					ignored++
				}
				return
			}
			n := found[r.Partition]
			if n == nil {
				n = new(newest)
				found[r.Partition] = n
			}
			switch {
			case own:
				n.own, n.hasOwn = lsn, true
			case n.hasOwn:
				ignored++ // unmarked after marked: not the relay's
			default:
				n.legacy, n.hasLegacy = lsn, true
			}
		})
	}
	if ignored > 0 {
		s.log.Warn("ignored records in the positions topic that carry this relay's key but were not written by it",
			zap.String("topic", topic), zap.String("transactional_id", s.cfg.TransactionalID), zap.Int("records", ignored))
	}
	var pos cdc.LSN
	for _, n := range found {
		switch {
		case n.hasOwn:
			pos = max(pos, n.own)
		case n.hasLegacy:
			pos = max(pos, n.legacy)
		}
	}
	return pos, nil
}

// Ready reports whether the latest round trip to a broker succeeded.
func (s *TxnSink) Ready() bool {
	return !s.run.Stopped() && s.health.ready()
}

// Close closes the client and reports every message not yet committed as
// failed (retryable, franz-go's ErrClientClosed): its source transaction
// is not covered by the position, so the next start sends it again, once.
// Close stops Run, when it runs, and waits until it has returned.
func (s *TxnSink) Close() error {
	if !s.run.Stop(&s.mu) {
		return nil
	}
	s.mu.Lock()
	left := append(s.ready, part{recs: s.open})
	s.ready, s.open = nil, nil
	s.mu.Unlock()
	s.current().Close()
	report(left, fmt.Errorf("kafka: %w", kgo.ErrClientClosed))
	return nil
}
