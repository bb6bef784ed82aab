package kafka

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
)

var _ relay.Pipeliner = (*Sink)(nil)

// Pipelined publishing (relay.Pipeliner). What franz-go guarantees, read
// from its producer (pkg/kgo sink.go and producer.go, v1.22):
//
//   - A record placed in a partition's buffer fails only together with
//     every record buffered behind it in that partition: a batch the
//     broker refuses for good, a retry or delivery-time limit, a
//     producer-id error that cannot be recovered, a purge or a close all
//     fail the partition's whole buffer (recBuf.failAllRecords), including
//     batches already written. Those written batches were not stored: with
//     idempotence the broker appends a batch only if its sequence follows
//     the last one it appended, and franz-go keeps a single request in
//     flight for a partition until the broker has acknowledged one from
//     this producer on that connection (okOnSink), because a broker
//     without state for the producer takes any sequence.
//   - A record can fail on its own before it reaches a partition's buffer:
//     larger than a batch (MESSAGE_TOO_LARGE from Produce), its topic's
//     metadata failing, the client closing. A record behind it in the
//     same partition is then buffered and sent as usual.
//   - Records produced after a partition failed its buffer start afresh:
//     nothing stops them from reaching the broker ahead of the failed
//     ones' retry, and promises run on their own goroutine, after the
//     failure.
//
// So the sink produces in rounds, with franz-go's manual flushing: it
// produces what Publish queued, flushes, and waits for every outcome of
// the round before producing the next. Within a round an aggregate's
// record joins only behind its previous one if that one is in a partition
// buffer (the partitioned hook ran during Produce) and has the same topic
// and key, so the same partition; otherwise it waits for the next round.
// When a record fails, its aggregate is held: the records of the
// aggregate queued or published later are failed without being produced,
// until the relay calls Resume. Between rounds every failure is known, so
// no later record of a failed aggregate is ever produced before Resume.
//
// A record whose aggregate has nothing in the sink (none queued, none
// awaiting its outcome) joins the round being flushed instead of waiting
// for the next one, when nothing is queued: Publish produces it at once,
// and the flush sends it. No earlier record of its aggregate can fail
// after it is produced, so it cannot overtake one; if a record ahead of
// it in its partition fails, franz-go fails it too and its aggregate is
// held as any other's. Once something is queued, records queue behind it,
// so that the round ends and the queued ones go out.
//
// What this does not cover: a topic whose partition count grows while a
// round is being produced can put two records of one key in different
// partitions (as it moves keys for every Kafka producer), and a broker
// that loses acknowledged records (franz-go's data loss detection resets
// the producer id and goes on).
type pipeline struct {
	s   *Sink
	max int // records per round, at most franz-go's buffer

	mu    sync.Mutex
	queue []*pending
	held  map[aggregate]struct{}
	// out counts each aggregate's records in the sink: queued, or
	// produced and awaiting their outcome.
	out map[aggregate]int
	// open: a round is being produced or flushed and records may join it
	// while it holds fewer than max (size); joining counts the joiners
	// inside Produce.
	open    bool
	size    int
	joining sync.WaitGroup
	// last and deferred are produceRound's, kept from one small round to
	// the next rather than allocated per round.
	last     map[aggregate]*pending
	deferred map[aggregate]bool
	// blamed is the first failed record of each partition in the round:
	// the ones behind it in the partition failed because it did.
	blamed map[partition]string
	closed bool

	kick    chan struct{}
	stopped chan struct{}
	round   sync.WaitGroup // the outcomes of the round being flushed
	ctx     context.Context
	cancel  context.CancelFunc
}

// maxRound bounds the records of one round. franz-go encodes a flushed
// round's records into produce requests at once, so a round of the whole
// window (10,000 records by default) costs that much memory again beside
// the window: with such rounds a million-row transaction peaked at 144-151
// MB (make bench, 200b-1tx), against 120 before the sink pipelined, when
// the per-aggregate gate let franz-go hold one record per aggregate. With
// rounds of 2,000 it peaked at 127 MB, and a hot aggregate still moved at
// x0.80 of 1,000 aggregates' rate, in one run of the same bench
// (bench/results/results-20261204-030617-kafka-round-2000.json).
const maxRound = 2000

type aggregate struct{ typ, id string }

type partition struct {
	topic string
	n     int32
}

// errHeld is the error of a record not produced because an earlier record
// of its aggregate failed. It is retryable: the relay hands the record
// over again behind the failed one.
type errHeld struct {
	topic string
	why   string
}

func (e *errHeld) Error() string {
	return fmt.Sprintf("produce to kafka topic %q: held back, %s", e.topic, e.why)
}

// pipeHook marks each record that franz-go places in a partition buffer.
type pipeHook struct{}

var _ kgo.HookProduceRecordPartitioned = pipeHook{}

// OnProduceRecordPartitioned implements kgo.HookProduceRecordPartitioned.
// It runs in Produce, for a topic whose partitions are known, or once
// they are.
func (pipeHook) OnProduceRecordPartitioned(r *kgo.Record, _ int32) {
	if p, ok := r.Context.(*pending); ok {
		p.partitioned.Store(true)
	}
}

// Pipeline implements relay.Pipeliner: it replaces the producing client
// by one with manual flushing and starts producing in rounds. It must be
// called before the first Publish; it reports false, and the sink stays as
// it was, when the new client cannot be created.
func (s *Sink) Pipeline() bool {
	opts := append(append([]kgo.Opt(nil), s.opts...),
		kgo.ManualFlushing(),
		kgo.WithLogger(quietFlushes{kzap.New(s.log)}),
		kgo.MaxBufferedRecords(s.maxInFlight),
		kgo.WithHooks(pipeHook{}),
		// A round ends only once each of its records has an outcome, so a
		// partition that franz-go keeps retrying would hold every other
		// partition's next round. Fail fast instead: the failed
		// aggregates are held and retried by the relay, with its backoff,
		// while the others go on. A record franz-go is unsure about (a
		// request timed out) is still retried until it knows.
		kgo.RecordRetries(1),
		kgo.UnknownTopicRetries(1),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		s.log.Warn("kafka sink cannot pipeline; one message per aggregate at a time", zap.Error(err))
		return false
	}
	s.client.Close()
	s.client = cl
	ctx, cancel := context.WithCancel(context.Background())
	s.pipe = &pipeline{
		s: s, max: min(s.maxInFlight, maxRound),
		held:     make(map[aggregate]struct{}),
		out:      make(map[aggregate]int),
		last:     make(map[aggregate]*pending),
		deferred: make(map[aggregate]bool),
		blamed:   make(map[partition]string),
		kick:     make(chan struct{}, 1),
		stopped:  make(chan struct{}),
		ctx:      ctx, cancel: cancel,
	}
	go s.pipe.run()
	return true
}

// quietFlushes is the pipelined client's logger: franz-go logs "flushing"
// at info level on every Flush, which a round calls, so a busy relay wrote
// a log line per round (over a thousand a second at 1,000 rows/s) and paid
// for encoding and writing each on the round's goroutine.
type quietFlushes struct{ kgo.Logger }

// Log implements kgo.Logger.
func (l quietFlushes) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelInfo && msg == "flushing" {
		return
	}
	l.Logger.Log(level, msg, keyvals...)
}

// Resume implements relay.Pipeliner.
func (s *Sink) Resume(aggregateType, aggregateID string) {
	if q := s.pipe; q != nil {
		q.mu.Lock()
		delete(q.held, aggregate{aggregateType, aggregateID})
		q.mu.Unlock()
	}
}

func aggregateOf(m *relay.Message) aggregate { return aggregate{m.AggregateType, m.AggregateID} }

// hold marks m's aggregate failed.
func (q *pipeline) hold(m *relay.Message) {
	q.mu.Lock()
	q.held[aggregateOf(m)] = struct{}{}
	q.mu.Unlock()
}

// enqueue produces p in the open round when it may join it (see
// pipeline), queues it for the next round otherwise, or fails it when its
// aggregate is held or the sink closed.
func (q *pipeline) enqueue(p *pending) {
	a := aggregateOf(p.m)
	q.mu.Lock()
	_, held := q.held[a]
	closed := q.closed
	join := false
	if !held && !closed {
		// Beyond max, franz-go would refuse the record (ErrMaxBuffered,
		// with manual flushing).
		join = q.open && q.size < q.max && len(q.queue) == 0 && q.out[a] == 0
		q.out[a]++
		if join {
			q.size++
			p.round = true
			q.round.Add(1)
			q.joining.Add(1)
		} else {
			q.queue = append(q.queue, p)
		}
	}
	q.mu.Unlock()
	switch {
	case held:
		q.s.finish(p, &errHeld{p.rec.Topic, "an earlier message of its aggregate failed"})
	case closed:
		q.s.finish(p, fmt.Errorf("produce to kafka topic %q: %w", p.rec.Topic, kgo.ErrClientClosed))
	case join:
		q.s.client.Produce(q.ctx, &p.rec, q.s.promise)
		q.joining.Done()
	default:
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
}

// settled records that p, counted in out, has its outcome.
func (q *pipeline) settled(p *pending) {
	a := aggregateOf(p.m)
	q.mu.Lock()
	if n := q.out[a] - 1; n > 0 {
		q.out[a] = n
	} else {
		delete(q.out, a)
	}
	q.mu.Unlock()
}

// run produces rounds until the sink closes.
func (q *pipeline) run() {
	defer close(q.stopped)
	for {
		select {
		case <-q.kick:
		case <-q.ctx.Done():
			return
		}
		for q.produceRound() {
		}
	}
}

// take returns the next round's candidates, oldest first.
func (q *pipeline) take() []*pending {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(q.queue), q.max)
	batch := q.queue[:n:n]
	if n == len(q.queue) {
		q.queue = nil
	} else {
		q.queue = q.queue[n:]
	}
	clear(q.blamed)
	q.open, q.size = n > 0, n
	return batch
}

// produceRound produces one round and waits for its outcomes. It reports
// whether there was anything to produce.
func (q *pipeline) produceRound() bool {
	batch := q.take()
	if len(batch) == 0 {
		return false
	}
	last, deferred := q.last, q.deferred
	var later []*pending // for the next round
	for _, p := range batch {
		a := aggregateOf(p.m)
		q.mu.Lock()
		_, held := q.held[a]
		q.mu.Unlock()
		if held {
			q.s.finishCounted(p, &errHeld{p.rec.Topic, "an earlier message of its aggregate failed"})
			continue
		}
		if deferred[a] {
			later = append(later, p)
			continue
		}
		if prev := last[a]; prev != nil && !follows(prev, p) {
			deferred[a] = true
			later = append(later, p)
			continue
		}
		last[a] = p
		q.round.Add(1)
		p.round = true
		q.s.client.Produce(q.ctx, &p.rec, q.s.promise)
	}
	if len(later) > 0 {
		q.mu.Lock()
		q.queue = append(later, q.queue...)
		q.mu.Unlock()
	}
	// Flush returns once every buffered record has its outcome, or when
	// the sink closes (the client then fails them); records that failed
	// before being buffered are waited for by round. Records join while
	// it flushes (and are sent at once); then the round closes, and a
	// second flush sends those that joined as the first one returned.
	_ = q.s.client.Flush(q.ctx)
	q.mu.Lock()
	q.open = false
	q.mu.Unlock()
	q.joining.Wait()
	_ = q.s.client.Flush(q.ctx)
	q.round.Wait()
	// Clearing costs what the maps grew to: after a large round, start
	// small again.
	if len(batch) > 256 {
		q.last, q.deferred = make(map[aggregate]*pending), make(map[aggregate]bool)
	} else {
		clear(last)
		clear(deferred)
	}
	return true
}

// follows reports whether p may be produced in the same round as prev, the
// previous record of its aggregate: prev is in a partition buffer, and p
// goes to the same partition.
func follows(prev, p *pending) bool {
	return prev.partitioned.Load() && prev.rec.Topic == p.rec.Topic && bytes.Equal(prev.rec.Key, p.rec.Key)
}

// failed is the error reported for p, produced in a round, which failed
// with err; it holds p's aggregate. The first failed record of a partition
// carries err; those behind it, failed by franz-go because it failed,
// carry a retryable errHeld, so that a record refused for good is not
// dead-lettered with its neighbours.
func (q *pipeline) failed(p *pending, r *kgo.Record, err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.held[aggregateOf(p.m)] = struct{}{}
	if !p.partitioned.Load() {
		return err
	}
	part := partition{r.Topic, r.Partition}
	first, ok := q.blamed[part]
	if !ok {
		q.blamed[part] = p.m.ID
		return err
	}
	return &errHeld{r.Topic, fmt.Sprintf("message %s ahead of it in partition %d failed (%v)", first, r.Partition, err)}
}

// close fails what is queued and stops the rounds; the client is closed.
func (q *pipeline) close() {
	q.mu.Lock()
	q.closed = true
	queued := q.queue
	q.queue = nil
	q.mu.Unlock()
	q.cancel()
	<-q.stopped
	for _, p := range queued {
		q.s.finishCounted(p, fmt.Errorf("produce to kafka topic %q: %w", p.rec.Topic, kgo.ErrClientClosed))
	}
}
