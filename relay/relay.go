// Package relay is the pipeline of outboxrelay: committed changes from cdc
// become envelopes, go to a Sink, and the WAL position is confirmed to
// PostgreSQL only once the broker has acknowledged every message before it.
//
// Guarantees: at-least-once delivery (a crash may repeat messages, never
// lose one); the first delivery of each message of one aggregate reaches the
// broker in commit order, whatever fails on the way (see aggregates); memory
// is bounded by Config.MaxInFlight and Config.MaxInFlightBytes.
package relay

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
)

// Columns names the outbox table's columns. Empty optional names mean the
// table has no such column.
type Columns struct {
	ID            string `yaml:"id"`
	AggregateType string `yaml:"aggregate_type"`
	AggregateID   string `yaml:"aggregate_id"`
	EventType     string `yaml:"event_type"`
	Payload       string `yaml:"payload"`
	Headers       string `yaml:"headers"`
	Traceparent   string `yaml:"traceparent"`
	SchemaVersion string `yaml:"schema_version"`
	CreatedAt     string `yaml:"created_at"`
}

// DefaultColumns are the column names of the table `outboxrelay migrate` creates.
func DefaultColumns() Columns {
	return Columns{
		ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
		Payload: "payload", Headers: "headers", Traceparent: "traceparent",
		SchemaVersion: "schema_version", CreatedAt: "created_at",
	}
}

// Required lists the columns every outbox table must have.
func (c Columns) Required() []string {
	return []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}
}

// DeadLetterFunc stores a message the broker will never take. It must return
// only once the message is durably stored; the relay confirms past the
// message after that.
type DeadLetterFunc func(ctx context.Context, m *Message) error

// Hooks observe the pipeline (metrics, tests). Every field is optional. Hooks
// are called from sink goroutines and must not block.
type Hooks struct {
	// Published is called once the broker has acknowledged m.
	Published func(m *Message, ackedAt time.Time)
	// PublishFailed is called for every failed attempt.
	PublishFailed func(m *Message, err error)
	// DeadLettered is called once m is stored as a dead letter.
	DeadLettered func(m *Message)
	// Parked is called once m is stored behind its aggregate's dead letter.
	Parked func(m *Message)
	// Skipped is called for every insert into a table the operator chose
	// not to relay (Config.Resolve returned "").
	Skipped func(table string)
}

// Config configures the pipeline.
type Config struct {
	// Database is written to the envelope's source.database.
	Database string
	// Tables are the outbox tables as schema.name. Empty: every published
	// table. Used only when Resolve is nil.
	Tables []string
	// Resolve maps a relation pgoutput announced to the outbox table whose
	// inserts it carries (a partition to its root, say), or to "" for a
	// table the operator chose to skip. An error stops the relay before it
	// confirms the transaction. Nil: a relation in Tables is itself, any
	// other stops the relay. Called from the stream goroutine, once per
	// announcement.
	Resolve func(ctx context.Context, rel *cdc.Relation) (string, error)
	Columns Columns
	// Format is FormatEnvelope (default), FormatCloudEvents (structured
	// content mode) or FormatCloudEventsBinary.
	Format Format
	// CloudEventsSource is the CloudEvents source attribute.
	CloudEventsSource string
	// MessagePrefix is the prefix of table-less outbox messages
	// (pg_logical_emit_message); default "outboxrelay".
	MessagePrefix string
	// MaxInFlight and MaxInFlightBytes bound the messages handed to the sink
	// and not yet acknowledged (defaults 10000 and 64 MiB).
	MaxInFlight      int
	MaxInFlightBytes int64
	// MaxAttempts is how often a message the broker rejects permanently is
	// tried before it is dead-lettered (default 5). Retryable failures are
	// retried without limit.
	MaxAttempts int
	// RetryMin and RetryMax bound the exponential retry backoff (defaults 100ms, 30s).
	RetryMin, RetryMax time.Duration
	// DeadLetter stores dead letters. When nil, a message that must be
	// dead-lettered stops the relay with an error instead.
	DeadLetter DeadLetterFunc
	// DeadLetterOrder is DeadLetterPark (default) or DeadLetterPass. It
	// applies to messages the broker refused; a row that cannot be built
	// into a message (invalid headers, say) is dead-lettered through
	// DeadLetter and parks nothing. Parking stores the parked aggregates;
	// when it is nil, later messages pass whatever DeadLetterOrder says.
	DeadLetterOrder DeadLetterOrder
	Parking         Parking
	// Checkpoint durably records a position before the relay confirms it to
	// PostgreSQL (cdc.Checkpoints.Save); Verify checks the slot against the
	// record when a session starts (cdc.Checkpoints.Verify). Both optional.
	Checkpoint func(ctx context.Context, lsn cdc.LSN) error
	Verify     func(ctx context.Context, slotConfirmed cdc.LSN) error
	// CheckpointInterval is how often a new position is recorded (default 1s).
	CheckpointInterval time.Duration
	Hooks              Hooks
	// Validate, when set, checks each message's content (its payload
	// against the schema of its event type and version, say) as the
	// message is built. An error dead-letters the message as an invalid
	// row is: never published, with the error. Called from the stream
	// goroutine; em must not be kept.
	Validate func(em *envelope.Message) error
}

// Format is the body format of published messages.
type Format string

// The body formats.
const (
	FormatEnvelope          Format = "envelope"
	FormatCloudEvents       Format = "cloudevents"
	FormatCloudEventsBinary Format = "cloudevents-binary"
)

func (c *Config) setDefaults() {
	if c.Columns == (Columns{}) {
		c.Columns = DefaultColumns()
	}
	if c.MessagePrefix == "" {
		c.MessagePrefix = "outboxrelay"
	}
	if c.Format == "" {
		c.Format = FormatEnvelope
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 10000
	}
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = 64 << 20
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = time.Second
	}
	if c.DeadLetterOrder == "" {
		c.DeadLetterOrder = DeadLetterPark
	}
}

// Source is the replication stream the relay consumes (*cdc.Stream).
type Source interface {
	Run(ctx context.Context, h cdc.Handler) error
}

// Relay moves committed outbox rows from a Source to a Sink. It implements
// cdc.Handler. Run it once.
type Relay struct {
	cfg     Config
	sink    Sink
	log     *zap.Logger
	tracker *tracker
	window  *window
	done    func(*Message, error)

	mappings map[uint32]*mapping // by relation id; replaced when the relation is announced again
	cur      cdc.Begin
	tx       *txn

	// Set by Run.
	sinkCtx    context.Context
	stopStream context.CancelFunc
	bg         sync.WaitGroup
	fatalOnce  sync.Once
	fatalErr   error
	fatal      chan struct{}
	retrying   atomic.Int64 // messages waiting for their next attempt
	atSink     atomic.Int64 // handed to the sink, outcome not reported yet
	answeredAt atomic.Int64 // Unix nanoseconds of the sink's last outcome, or of the start of a wait
	storing    atomic.Int64 // dead letters being stored
	order      *aggregates
	// handoff carries messages released by their aggregate's previous one
	// to publishLoop: outcomes arrive on sink goroutines, which must not
	// publish. Its capacity is Config.MaxInFlight, more than the messages
	// the window lets exist, so a send never blocks.
	handoff   chan *Message
	retryMu   sync.Mutex
	retryQ    []retryEntry // by due time
	retryKick chan struct{}
	seq       uint64 // publish order, dispatch goroutine only
	// unordered hands every message over at once, without waiting for its
	// aggregate's previous one: the order of first deliveries is then lost
	// under failures. Only BenchmarkAggregateOrder sets it, to measure what
	// the per-aggregate order costs.
	unordered bool
	bgMu      sync.Mutex
	closing   bool
	// recorded is the newest position saved by Config.Checkpoint: the one
	// reported to PostgreSQL.
	recorded     atomic.Uint64
	checkpointMu sync.Mutex
	unrecorded   atomic.Bool
}

var _ cdc.Handler = (*Relay)(nil)

// New returns a Relay. It starts nothing.
func New(cfg Config, sink Sink, log *zap.Logger) *Relay {
	cfg.setDefaults()
	if log == nil {
		log = zap.NewNop()
	}
	r := &Relay{
		cfg:       cfg,
		sink:      sink,
		log:       log.Named("relay"),
		tracker:   newTracker(),
		window:    newWindow(cfg.MaxInFlight, cfg.MaxInFlightBytes),
		mappings:  make(map[uint32]*mapping),
		fatal:     make(chan struct{}),
		order:     newAggregates(),
		handoff:   make(chan *Message, cfg.MaxInFlight),
		retryKick: make(chan struct{}, 1),
	}
	r.done = r.onDone
	return r
}

// Run relays until ctx is cancelled or a fatal error occurs. On cancellation
// it stops reading, waits for in-flight messages to be acknowledged, confirms
// the final position and returns nil.
func (r *Relay) Run(ctx context.Context, src Source) error {
	// The sink outlives ctx so that messages in flight can still be
	// acknowledged while the stream drains, as http.Server.Shutdown does.
	sinkCtx, stopSink := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSink()
	r.sinkCtx = sinkCtx
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	r.stopStream = stopStream

	g, gctx := errgroup.WithContext(sinkCtx)
	if runner, ok := r.sink.(Runner); ok {
		g.Go(func() error {
			err := runner.Run(gctx)
			if err != nil && sinkCtx.Err() == nil {
				r.fail(fmt.Errorf("sink: %w", err))
			}
			return nil
		})
	}
	g.Go(func() error {
		r.retryLoop(sinkCtx)
		return nil
	})
	g.Go(func() error {
		r.publishLoop(sinkCtx)
		return nil
	})
	if r.cfg.Checkpoint != nil {
		g.Go(func() error {
			t := time.NewTicker(r.cfg.CheckpointInterval)
			defer t.Stop()
			for {
				select {
				case <-streamCtx.Done():
					return nil
				case <-t.C:
					_ = r.checkpoint(streamCtx) // logged; retried at the next tick
				}
			}
		})
	}
	err := src.Run(streamCtx, r)
	stopStream()
	stopSink()
	r.bgMu.Lock()
	r.closing = true
	r.bgMu.Unlock()
	stopped := make(chan struct{})
	go func() {
		r.bg.Wait()
		_ = g.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		// A publish that ignores cancellation must not hang the shutdown:
		// closing the sink fails it.
		r.log.Warn("sink did not stop publishing; closing it")
	}
	if cerr := r.sink.Close(); cerr != nil {
		r.log.Warn("close sink", zap.Error(cerr))
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		r.log.Error("sink goroutines did not stop after close; exiting without them")
	}
	if r.fatalErr != nil {
		return r.fatalErr
	}
	return err
}

// Fail stops the relay with err, as a fatal error of its own would: the
// stream stops, nothing more is confirmed beyond what the broker
// acknowledged, and Run returns err. Safe for concurrent use; only the
// first error counts.
func (r *Relay) Fail(err error) { r.fail(err) }

// fail stops the relay with err.
func (r *Relay) fail(err error) {
	r.fatalOnce.Do(func() {
		r.fatalErr = err
		close(r.fatal)
		r.log.Error("stopping", zap.Error(err))
		if r.stopStream != nil {
			r.stopStream()
		}
	})
}

// Confirmed implements cdc.Handler: the newest position that every message
// before it was acknowledged and that has been recorded by Config.Checkpoint.
//
// When recording fails because PostgreSQL is shutting down or gone
// (ServerGone), the
// relay confirms the acknowledged position unrecorded: a shutting-down
// walsender waits for its client to confirm everything it sent, and a relay
// that withheld confirmation would hold the server's shutdown hostage. The
// position is recorded at the start of the next session, before the slot is
// verified.
func (r *Relay) Confirmed() cdc.LSN {
	if r.cfg.Checkpoint == nil || r.unrecorded.Load() {
		return r.tracker.Confirmed()
	}
	return cdc.LSN(r.recorded.Load())
}

// checkpoint records the tracker's position if it moved.
func (r *Relay) checkpoint(ctx context.Context) error {
	r.checkpointMu.Lock()
	defer r.checkpointMu.Unlock()
	c := r.tracker.Confirmed()
	if uint64(c) <= r.recorded.Load() {
		return nil
	}
	saveCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.cfg.Checkpoint(saveCtx, c); err != nil {
		if ctx.Err() != nil {
			return err // our own cancellation says nothing about PostgreSQL
		}
		if !ServerGone(err) {
			// A lock, a timeout, a full disk: hold the confirmation. An
			// unrecorded confirmation would make the next start see the slot
			// ahead of the record and refuse, with nothing lost.
			r.log.Warn("record checkpoint failed; holding the confirmed position until it succeeds", zap.Error(err))
			return err
		}
		if !r.unrecorded.Swap(true) {
			r.log.Warn("record checkpoint failed: PostgreSQL is shutting down or gone; confirming progress unrecorded until it succeeds", zap.Error(err))
		}
		return err
	}
	r.recorded.Store(uint64(c))
	r.unrecorded.Store(false)
	return nil
}

// Start implements cdc.Handler.
func (r *Relay) Start(ctx context.Context, slotConfirmed cdc.LSN) error {
	if r.unrecorded.Load() {
		// What this process confirmed unrecorded must be on record before the
		// slot is compared with the record.
		var err error
		for attempt := 0; attempt < 20; attempt++ {
			if err = r.checkpoint(ctx); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
		if err != nil {
			return fmt.Errorf("record checkpoint before resuming: %w", err)
		}
	}
	if r.cfg.Verify != nil {
		if err := r.cfg.Verify(ctx, slotConfirmed); err != nil {
			return err
		}
	}
	// Another relay on the slot (a standby taking over) or an earlier run
	// may have parked aggregates: know them before the first message.
	if err := r.loadHeads(ctx); err != nil {
		return err
	}
	r.tracker.idle(slotConfirmed)
	// The slot's own position needs no recording: it is already confirmed.
	r.checkpointMu.Lock()
	if uint64(slotConfirmed) > r.recorded.Load() {
		r.recorded.Store(uint64(slotConfirmed))
	}
	r.checkpointMu.Unlock()
	return nil
}

// Inflight returns the number of messages handed to the sink and not yet
// acknowledged. Safe for concurrent use.
func (r *Relay) Inflight() int { return r.window.inflight() }

// LagSince returns the commit time that replication lag in seconds counts
// from: that of the oldest committed message the broker has not
// acknowledged, or, when nothing is pending, that of the newest transaction
// the relay has seen (a heartbeat on an idle relay). Zero until the relay has
// seen a transaction. It is the database server's clock. Safe for
// concurrent use.
func (r *Relay) LagSince() time.Time { return r.tracker.lagSince() }

// Retrying reports whether some message is waiting to be published again
// or to be stored as a dead letter. Safe for concurrent use.
func (r *Relay) Retrying() bool { return r.retrying.Load() > 0 || r.storing.Load() > 0 }

// Unacknowledged implements cdc.Handler.
func (r *Relay) Unacknowledged() int {
	n, _ := r.tracker.inflight()
	return n
}

// Idle implements cdc.Handler.
func (r *Relay) Idle(walEnd cdc.LSN) { r.tracker.idle(walEnd) }

// Reset implements cdc.Handler.
func (r *Relay) Reset() {
	r.tracker.reset()
	r.tx = nil
	clear(r.mappings)
}

// Drain implements cdc.Handler. Whatever happens, it records the position
// reached so far before it returns.
func (r *Relay) Drain(ctx context.Context) error {
	if r.cfg.Checkpoint != nil {
		// Not bound by ctx, which may have expired: checkpoint has its own timeout.
		defer func() { _ = r.checkpoint(context.WithoutCancel(ctx)) }()
	}
	for {
		n, drained := r.tracker.inflight()
		if n == 0 {
			return nil
		}
		r.log.Info("draining", zap.Int("inflight", n))
		select {
		case <-drained:
		case <-r.fatal:
			return r.fatalErr
		case <-ctx.Done():
			return fmt.Errorf("%d messages still unacknowledged: %w", n, ctx.Err())
		}
	}
}

// Begin implements cdc.Handler.
func (r *Relay) Begin(_ context.Context, b cdc.Begin) error {
	r.cur = b
	r.tx = r.tracker.beginAt(b.CommitTime)
	return nil
}

// Commit implements cdc.Handler.
func (r *Relay) Commit(_ context.Context, c cdc.Commit) error {
	r.tracker.commit(c.EndLSN)
	r.tx = nil
	return nil
}

// Insert implements cdc.Handler.
func (r *Relay) Insert(ctx context.Context, ins *cdc.Insert) error {
	mp, err := r.mapping(ctx, ins.Relation)
	if err != nil {
		return err
	}
	if mp.skip {
		if h := r.cfg.Hooks.Skipped; h != nil {
			h(ins.Relation.QualifiedName())
		}
		return nil
	}
	m, buildErr := r.buildRow(mp, ins)
	return r.dispatch(ctx, m, buildErr)
}

// Message implements cdc.Handler.
func (r *Relay) Message(ctx context.Context, lm *cdc.LogicalMessage) error {
	if lm.Prefix != r.cfg.MessagePrefix {
		return nil // heartbeats and other tools' messages
	}
	if !lm.Transactional && r.tx == nil {
		// Not tied to a transaction: track it on its own. It never moves the
		// watermark itself (end 0), but holds back later positions until acked.
		r.tx = r.tracker.begin()
		defer func() {
			r.tracker.commit(0)
			r.tx = nil
		}()
	}
	// A non-transactional message inside an open transaction (pgoutput
	// without streaming never interleaves them, but a decoder that did must
	// not break the watermark) is counted with that transaction: opening a
	// tracker entry of its own would end the open one, whose commit would
	// then find nothing to close, and the watermark would stop for good.
	m, buildErr := r.buildEmitted(lm)
	if !lm.Transactional && buildErr == nil {
		// PostgreSQL decodes a non-transactional message at once, whether its
		// transaction commits or not: publishing it could publish a rolled-back
		// event, ahead of its transaction.
		buildErr = errors.New("non-transactional logical decoding message: it may belong to a rolled-back transaction; emit with pg_logical_emit_message(true, ...)")
	}
	return r.dispatch(ctx, m, buildErr)
}

// dispatch counts m in flight and publishes it, or holds it behind its
// aggregate's unsettled message (see aggregates). An invalid message is
// dead-lettered at once: it is never published, so it holds nothing back.
func (r *Relay) dispatch(ctx context.Context, m *Message, buildErr error) error {
	if r.tx == nil {
		return errors.New("change outside a transaction")
	}
	if err := r.window.acquire(ctx, len(m.Envelope)); err != nil {
		return err
	}
	m.tx = r.tx
	m.seq = r.seq
	r.seq++
	r.tracker.add(r.tx)
	if buildErr != nil {
		m.Attempts = 1
		m.FirstFailure = time.Now()
		m.LastFailure = m.FirstFailure
		m.LastError = fmt.Errorf("invalid outbox message: %w", buildErr)
		r.deadLetter(m, false)
		return nil
	}
	if r.unordered {
		r.publish(ctx, m)
	} else if r.order.admit(m) {
		r.send(ctx, m)
	}
	return nil
}

// publish hands m to the sink, counting it as awaiting the broker's answer.
func (r *Relay) publish(ctx context.Context, m *Message) {
	if r.atSink.Add(1) == 1 {
		r.answeredAt.Store(time.Now().UnixNano()) // the wait starts now
	}
	r.sink.Publish(ctx, m, r.done)
}

// Unanswered returns how long the sink has held messages without reporting
// a single outcome (acknowledgement or failure), and how many it holds; 0
// when it holds none. A broker that accepts connections but answers
// nothing shows here within seconds, long before any publish times out.
// Safe for concurrent use.
func (r *Relay) Unanswered() (time.Duration, int) {
	n := r.atSink.Load()
	if n <= 0 {
		return 0, 0
	}
	return max(0, time.Since(time.Unix(0, r.answeredAt.Load()))), int(n)
}

// onDone receives every publish outcome, from any goroutine.
func (r *Relay) onDone(m *Message, err error) {
	r.answeredAt.Store(time.Now().UnixNano())
	r.atSink.Add(-1)
	if err == nil {
		if h := r.cfg.Hooks.Published; h != nil {
			h(m, time.Now())
		}
		r.settle(m, true)
		return
	}
	if r.sinkCtx.Err() != nil {
		// Shutting down: the message stays unconfirmed and is delivered
		// again after restart, and so do the ones held behind it.
		return
	}
	now := time.Now()
	if m.Attempts == 0 {
		m.FirstFailure = now
	}
	m.Attempts++
	m.LastFailure = now
	m.LastError = err
	if h := r.cfg.Hooks.PublishFailed; h != nil {
		h(m, err)
	}
	if !Retryable(err) && m.Attempts >= r.cfg.MaxAttempts {
		r.deadLetter(m, true)
		return
	}
	// The aggregate's later messages stay held until m is settled: none of
	// them is at the sink, so none can arrive before m's retry.
	r.retry(m)
}

// settle completes m and, when m was published through the per-aggregate
// order (gated), hands its aggregate's next message to publishLoop.
func (r *Relay) settle(m *Message, gated bool) {
	var next *Message
	if gated && !r.unordered {
		next = r.order.next(m)
	}
	r.complete(m)
	if next != nil {
		r.handoff <- next
	}
}

// publishLoop publishes (or parks) the messages released by settle.
func (r *Relay) publishLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-r.handoff:
			r.send(ctx, m)
		}
	}
}

func (r *Relay) complete(m *Message) {
	r.window.release(len(m.Envelope))
	r.tracker.ack(m.tx)
	if m.pooled {
		// The sink is done with m (Sink contract): reuse its buffer.
		putBuffer(m.Envelope)
		m.Envelope, m.pooled = nil, false
	}
}

// Envelope buffers are pooled: allocating and zeroing a fresh one per row
// was a tenth of the relay's CPU.
var buffers sync.Pool

const maxPooledBuffer = 64 << 10

func getBuffer(size int) []byte {
	if bp, ok := buffers.Get().(*[]byte); ok && cap(*bp) >= size {
		return (*bp)[:0]
	}
	return make([]byte, 0, max(size, 2048))
}

func putBuffer(b []byte) {
	if cap(b) > maxPooledBuffer {
		return
	}
	b = b[:0]
	buffers.Put(&b)
}

func (r *Relay) backoff(attempt int) time.Duration {
	d := r.cfg.RetryMin
	for i := 1; i < attempt && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMax)
	return d/2 + rand.N(d/2+1)
}

// retryEntry is a failed message and when to publish it again.
type retryEntry struct {
	m   *Message
	due time.Time
}

// retry publishes m again after its backoff. Retries need no order among
// themselves: each is the only unsettled message of its aggregate.
func (r *Relay) retry(m *Message) {
	wait := r.backoff(m.Attempts)
	r.log.Warn("publish failed; retrying", zap.String("message_id", m.ID), zap.String("destination", m.Destination),
		zap.Int("attempt", m.Attempts), zap.Duration("retry_in", wait), zap.Error(m.LastError))
	e := retryEntry{m: m, due: time.Now().Add(wait)}
	r.retrying.Add(1)
	r.retryMu.Lock()
	i := sort.Search(len(r.retryQ), func(i int) bool { return r.retryQ[i].due.After(e.due) })
	r.retryQ = slices.Insert(r.retryQ, i, e)
	r.retryMu.Unlock()
	select {
	case r.retryKick <- struct{}{}:
	default:
	}
}

// retryLoop publishes queued retries once they are due.
func (r *Relay) retryLoop(ctx context.Context) {
	for {
		r.retryMu.Lock()
		now := time.Now()
		n := 0
		for n < len(r.retryQ) && !r.retryQ[n].due.After(now) {
			n++
		}
		due := slices.Clone(r.retryQ[:n])
		r.retryQ = slices.Delete(r.retryQ, 0, n)
		wait := time.Duration(-1)
		if len(r.retryQ) > 0 {
			wait = r.retryQ[0].due.Sub(now)
		}
		r.retryMu.Unlock()
		for _, e := range due {
			r.retrying.Add(-1)
			r.publish(ctx, e.m)
		}
		if len(due) > 0 {
			continue // publishing took time: look again
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if wait >= 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-r.retryKick:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// goBackground runs f on a goroutine that Run waits for, unless Run is
// already waiting (shutdown): then it reports false and runs nothing.
func (r *Relay) goBackground(f func()) bool {
	r.bgMu.Lock()
	defer r.bgMu.Unlock()
	if r.closing {
		return false
	}
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		f()
	}()
	return true
}

// deadLetter stores m as a dead letter, then settles it; gated says whether
// m was published through the per-aggregate order, whose next message it
// holds back until stored. With DeadLetterPark, a gated m is stored as the
// head of its parked aggregate, and the aggregate is parked before its next
// message is released.
func (r *Relay) deadLetter(m *Message, gated bool) {
	head := gated && r.parking()
	store := r.cfg.DeadLetter
	if head {
		store = r.cfg.Parking.AddHead
	}
	if store == nil {
		r.fail(fmt.Errorf("message %s to %q failed %d times and no dead-letter store is configured: %w", m.ID, m.Destination, m.Attempts, m.LastError))
		return
	}
	r.goBackground(func() {
		r.storing.Add(1) // /readyz shows a dead letter that cannot be stored yet
		defer r.storing.Add(-1)
		for attempt := 1; ; attempt++ {
			err := store(r.sinkCtx, m)
			if err == nil {
				break
			}
			if r.sinkCtx.Err() != nil {
				return
			}
			if permanentStoreError(err) {
				r.fail(fmt.Errorf("store dead letter for message %s: %w", m.ID, err))
				return
			}
			wait := r.backoff(attempt)
			r.log.Warn("store dead letter failed; retrying", zap.String("message_id", m.ID), zap.Duration("retry_in", wait), zap.Error(err))
			select {
			case <-time.After(wait):
			case <-r.sinkCtx.Done():
				return
			}
		}
		r.log.Warn("dead-lettered", zap.String("message_id", m.ID), zap.String("destination", m.Destination),
			zap.Int("attempts", m.Attempts), zap.Bool("parks_aggregate", head), zap.Error(m.LastError))
		if h := r.cfg.Hooks.DeadLettered; h != nil {
			h(m)
		}
		if head {
			r.order.park(keyOf(m))
		}
		r.settle(m, gated)
	})
}

// ServerGone reports whether err says that PostgreSQL is shutting down or
// the connection to it is gone: SQLSTATE class 57P (operator
// intervention: shutdown, crash shutdown, cannot connect now) or 08
// (connection exception), or a network failure. Any other failure to
// record a checkpoint (a lock wait, a statement timeout) is not.
func ServerGone(err error) bool {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		code := coded.SQLState()
		return strings.HasPrefix(code, "57P") || strings.HasPrefix(code, "08")
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return false
	}
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		strings.Contains(err.Error(), "failed to connect") || strings.Contains(err.Error(), "conn closed")
}

// permanentStoreError reports SQLSTATE classes that retrying will not fix:
// 22 data exception, 23 integrity violation, 42 syntax or privilege.
func permanentStoreError(err error) bool {
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return false
	}
	code := coded.SQLState()
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23") || strings.HasPrefix(code, "42")
}

// mapping locates the configured columns in a relation.
type mapping struct {
	rel *cdc.Relation
	// skip: the operator chose not to relay the table's inserts.
	skip                                           bool
	table                                          string
	id, aggType, aggID, eventType, payload         int
	headers, traceparent, schemaVersion, createdAt int
	payloadFormat                                  envelope.PayloadFormat
}

func (r *Relay) mapping(ctx context.Context, rel *cdc.Relation) (*mapping, error) {
	if mp, ok := r.mappings[rel.ID]; ok && mp.rel == rel {
		return mp, nil
	}
	idx := func(name string) int {
		if name == "" {
			return -1
		}
		for i, c := range rel.Columns {
			if c.Name == name {
				return i
			}
		}
		return -1
	}
	c := r.cfg.Columns
	table := rel.QualifiedName()
	if r.cfg.Resolve != nil {
		var err error
		if table, err = r.cfg.Resolve(ctx, rel); err != nil {
			return nil, err
		}
	} else if len(r.cfg.Tables) > 0 && !slices.Contains(r.cfg.Tables, table) {
		return nil, cdc.UnknownRelation("", rel)
	}
	if table == "" {
		r.log.Warn("skipping the inserts of a table in postgres.ignore_tables", zap.String("table", rel.QualifiedName()))
		mp := &mapping{rel: rel, skip: true}
		r.mappings[rel.ID] = mp
		return mp, nil
	}
	mp := &mapping{
		table: table,
		id:    idx(c.ID), aggType: idx(c.AggregateType), aggID: idx(c.AggregateID), eventType: idx(c.EventType),
		payload: idx(c.Payload), headers: idx(c.Headers), traceparent: idx(c.Traceparent),
		schemaVersion: idx(c.SchemaVersion), createdAt: idx(c.CreatedAt),
	}
	for name, i := range map[string]int{c.ID: mp.id, c.AggregateType: mp.aggType, c.AggregateID: mp.aggID, c.EventType: mp.eventType, c.Payload: mp.payload} {
		if i < 0 {
			return nil, &cdc.SetupError{Msg: fmt.Sprintf("outbox table %s has no column %q; add it or map it in postgres.columns", mp.table, name)}
		}
	}
	switch rel.Columns[mp.payload].TypeOID {
	case cdc.OIDJSONB, cdc.OIDJSON:
		mp.payloadFormat = envelope.PayloadJSON
	case cdc.OIDBytea:
		mp.payloadFormat = envelope.PayloadBinary
	default:
		mp.payloadFormat = envelope.PayloadText
	}
	mp.rel = rel
	r.mappings[rel.ID] = mp
	return mp, nil
}

func col(vals [][]byte, i int) []byte {
	if i < 0 {
		return nil
	}
	return vals[i]
}

// buildRow makes the message for an inserted row. When the row is invalid it
// still returns a message (with as much of the envelope as could be built)
// and the reason, so that the row is dead-lettered rather than lost.
func (r *Relay) buildRow(mp *mapping, ins *cdc.Insert) (*Message, error) {
	v := ins.Values
	var errs []error
	req := func(i int, name string) string {
		b := col(v, i)
		if len(b) == 0 {
			errs = append(errs, fmt.Errorf("column %s is null or empty", name))
		}
		return string(b)
	}
	c := r.cfg.Columns
	em := envelope.Message{
		MessageID:     req(mp.id, c.ID),
		AggregateType: req(mp.aggType, c.AggregateType),
		AggregateID:   req(mp.aggID, c.AggregateID),
		EventType:     req(mp.eventType, c.EventType),
		SchemaVersion: 1,
		Headers:       col(v, mp.headers),
		Payload:       col(v, mp.payload),
		PayloadFormat: mp.payloadFormat,
	}
	if mp.payloadFormat == envelope.PayloadBinary && em.Payload != nil {
		raw, err := decodeBytea(em.Payload)
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %w", c.Payload, err))
		}
		em.Payload = raw
	}
	if em.Payload == nil {
		errs = append(errs, fmt.Errorf("column %s is null", c.Payload))
	}
	if b := col(v, mp.schemaVersion); b != nil {
		n, err := strconv.Atoi(string(b))
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %q is not an integer", c.SchemaVersion, b))
		} else {
			em.SchemaVersion = n
		}
	}
	em.OccurredAt = r.cur.CommitTime
	if b := col(v, mp.createdAt); b != nil {
		if t, err := envelope.ParseTimestamp(b); err == nil {
			em.OccurredAt = t
		}
	}
	return r.finish(&em, mp.table, envelope.TraceparentColumn(string(col(v, mp.traceparent))), ins.LSN, errs)
}

func (r *Relay) buildEmitted(lm *cdc.LogicalMessage) (*Message, error) {
	e, err := envelope.ParseEmitted(lm.Content)
	if err != nil {
		// Keep the content so the dead letter shows what was sent.
		em := envelope.Message{MessageID: e.ID, Payload: lm.Content, PayloadFormat: envelope.PayloadText, OccurredAt: r.cur.CommitTime}
		return r.finish(&em, "", "", lm.LSN, []error{err})
	}
	em := envelope.Message{
		MessageID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventType: e.EventType,
		SchemaVersion: e.SchemaVersion, Headers: e.Headers, Payload: e.Payload, PayloadFormat: envelope.PayloadJSON,
		OccurredAt: r.cur.CommitTime,
	}
	return r.finish(&em, "", e.Traceparent, lm.LSN, nil)
}

func (r *Relay) finish(em *envelope.Message, table, traceparent string, lsn cdc.LSN, errs []error) (*Message, error) {
	if len(errs) == 0 && r.cfg.Validate != nil {
		if err := r.cfg.Validate(em); err != nil {
			errs = append(errs, err)
		}
	}
	em.TraceID, em.Traceparent = envelope.Trace(traceparent, em.MessageID)
	headers, err := envelope.ParseHeaders(em.Headers)
	if err != nil {
		errs = append(errs, err)
		em.Headers = nil
	}
	em.Source = envelope.Source{
		Database: r.cfg.Database, Table: table, LSN: uint64(lsn), CommitLSN: uint64(r.cur.FinalLSN),
		XID: r.cur.XID, CommittedAt: r.cur.CommitTime,
	}
	m := &Message{
		ID: em.MessageID, AggregateType: em.AggregateType, AggregateID: em.AggregateID, EventType: em.EventType,
		Table: table, Traceparent: em.Traceparent,
		CommitTime: r.cur.CommitTime, LSN: lsn, CommitLSN: r.cur.FinalLSN,
	}
	m.Headers, m.Tracestate = r.brokerHeaders(m, headers, traceparent)
	buf := getBuffer(len(em.Payload) + len(em.Headers) + 512)
	switch r.cfg.Format {
	case FormatCloudEvents:
		m.Envelope = em.AppendCloudEvent(buf, r.cfg.CloudEventsSource)
		m.pooled = true
		m.ContentType = "application/cloudevents+json"
	case FormatCloudEventsBinary:
		body, ct := em.CloudEventData()
		m.Envelope = append(buf[:0:0], body...)
		m.ContentType = ct
		m.Attributes = em.CloudEventAttributes(r.cfg.CloudEventsSource)
	default:
		m.Envelope = em.AppendJSON(buf)
		m.pooled = true
	}
	return m, errors.Join(errs...)
}

// decodeBytea decodes PostgreSQL's hex bytea output (\x...).
func decodeBytea(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, errors.New("bytea value is not in hex format")
	}
	out := make([]byte, hex.DecodedLen(len(b)-2))
	if _, err := hex.Decode(out, b[2:]); err != nil {
		return nil, fmt.Errorf("decode bytea: %w", err)
	}
	return out, nil
}
