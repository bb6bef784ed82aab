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
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/internal/rules"
)

// Relay moves committed outbox rows from a Source to a Sink. Run it once:
// Run owns every goroutine of the relay and stops them all before it
// returns. Fail, InFlight, LagSince, Retrying and Unanswered are safe for
// concurrent use, before, during and after Run.
type Relay struct {
	// Relay is the lifecycle: Run starts every goroutine of the pipeline
	// and stops them all before it returns. The parts, each documented
	// with the goroutine that drives it: handler (the cdc.Handler the
	// Source calls, with the Builder that makes the messages), publisher
	// (per-aggregate order, outcomes, retries, dead letters, parking) and
	// checkpointer (the tracker's watermark, recorded and confirmed).
	cfg     settings
	sink    Sink
	log     *zap.Logger
	failure *failure
	bg      *background
	window  *window
	tracker *tracker
	handler *handler
	pub     *publisher   // the first sink's, which exactly once uses
	lanes   []*publisher // one per sink, in the order NewSinks got them
	cp      *checkpointer
}

// settings are what the parts of a Relay read: its Config, with defaults,
// and its Options.
type settings struct {
	Config
	Options
	// rules are Config.Rules compiled, nil without routes; rulesErr is why
	// they do not compile (Validate reports it first), which every row is
	// then dead-lettered with.
	rules    *rules.Set
	rulesErr error
}

func newSettings(cfg Config, opts Options) settings {
	s := settings{Config: cfg.WithDefaults(), Options: opts}
	s.rules, s.rulesErr = s.compileRules()
	return s
}

// New returns a Relay that publishes to sink as cfg says and calls out to
// what opts holds. It starts nothing.
func New(cfg Config, sink Sink, log *zap.Logger, opts Options) *Relay {
	return NewSinks(cfg, []NamedSink{{Sink: sink}}, log, opts)
}

// NewSinks returns a Relay that feeds every sink of sinks (at least one)
// from its one Source: each message goes to the sink its route names
// (Message.Sink), else to the first. Each sink has its own per-aggregate
// order, retries, dead letters, parking and watermark; the position
// confirmed to PostgreSQL is the lowest of their watermarks. It starts
// nothing.
func NewSinks(cfg Config, sinks []NamedSink, log *zap.Logger, opts Options) *Relay {
	if log == nil {
		log = zap.NewNop()
	}
	r := &Relay{
		cfg:     newSettings(cfg, opts),
		sink:    sinks[0].Sink,
		log:     log.Named("relay"),
		bg:      &background{},
		tracker: newSinksTracker(len(sinks)),
	}
	r.window = newWindow(r.cfg.MaxInFlight, r.cfg.MaxInFlightBytes)
	seq := new(atomic.Uint64)
	r.failure = &failure{log: r.log, done: make(chan struct{})}
	for i, ns := range sinks {
		p := newPublisher(&r.cfg, ns.Sink, r.log, r.failure, r.bg, r.window, r.tracker)
		p.lane, p.name, p.seq = i, ns.Name, seq
		if len(sinks) > 1 {
			p.log = r.log.With(zap.String("sink", ns.Name))
			p.queue = make(chan *Message, r.cfg.MaxInFlight)
			p.queuedOnes = map[*Message]struct{}{}
			if r.cfg.Spill != nil && r.cfg.Behind == BehindSpill {
				p.spill = newSpiller(p, r.cfg.Spill, len(sinks))
			}
		}
		r.lanes = append(r.lanes, p)
	}
	r.pub = r.lanes[0]
	r.cp = newCheckpointer(&r.cfg, r.log, r.tracker)
	r.handler = &handler{
		cfg: &r.cfg, log: r.log, failure: r.failure, build: newBuilder(&r.cfg, r.log),
		pub: r.pub, lanes: newLanes(r.lanes), cp: r.cp, window: r.window, tracker: r.tracker, seq: seq,
	}
	if txnSink, ok := r.sink.(Transactional); ok && len(sinks) == 1 {
		r.handler.batch = &txnBatch{sink: txnSink}
	}
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
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	r.failure.stopStream = stopStream

	g, gctx := errgroup.WithContext(sinkCtx)
	for _, p := range r.lanes {
		p.ctx = sinkCtx
		r.runLane(sinkCtx, gctx, g, p)
	}
	if r.cfg.Checkpoint != nil {
		g.Go(func() error {
			r.cp.run(streamCtx)
			return nil
		})
	}
	err := src.Run(streamCtx, r.handler)
	stopStream()
	stopSink()
	r.bg.close()
	stopped := make(chan struct{})
	go func() {
		r.bg.wait()
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
	for _, p := range r.lanes {
		if cerr := p.sink.Close(); cerr != nil {
			p.log.Warn("close sink", zap.Error(cerr))
		}
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		r.log.Error("sink goroutines did not stop after close; exiting without them")
	}
	if r.failure.err != nil {
		return r.failure.err
	}
	return err
}

// Fail stops the relay with err, as a fatal error of its own would: the
// stream stops, nothing more is confirmed beyond what the broker
// acknowledged, and Run returns err. Safe for concurrent use; only the
// first error counts.
func (r *Relay) Fail(err error) { r.failure.fail(err) }

// InFlight returns the number of messages handed to the sink and not yet
// acknowledged. Safe for concurrent use.
func (r *Relay) InFlight() int { return r.window.inFlight() }

// LagSince returns the commit time that replication lag in seconds counts
// from: that of the oldest committed message the broker has not
// acknowledged, or, when nothing is pending, that of the newest transaction
// the relay has seen (a heartbeat on an idle relay). Zero until the relay has
// seen a transaction. It is the database server's clock. Safe for
// concurrent use.
func (r *Relay) LagSince() time.Time { return r.tracker.lagSince() }

// Retrying reports whether some message is waiting to be published again
// or to be stored as a dead letter. Safe for concurrent use.
func (r *Relay) Retrying() bool {
	for _, p := range r.lanes {
		if p.retrying() {
			return true
		}
	}
	return false
}

// Unanswered returns how long the sink has held messages without reporting
// a single outcome (acknowledgement or failure), and how many it holds; 0
// when it holds none. A broker that accepts connections but answers
// nothing shows here within seconds, long before any publish times out.
// Safe for concurrent use.
func (r *Relay) Unanswered() (time.Duration, int) {
	var longest time.Duration
	var held int
	for _, p := range r.lanes {
		d, n := p.unanswered()
		longest, held = max(longest, d), held+n
	}
	return longest, held
}

// failure is the relay's first fatal error: it stops the stream, and Run
// returns it. Any goroutine may fail it; Run, which owns it, returns err
// as it ends.
type failure struct {
	log  *zap.Logger
	once sync.Once
	err  error         // set before done is closed
	done chan struct{} // closed by the first fail
	// stopStream ends the Source's Run; set by Run before the stream starts.
	stopStream context.CancelFunc
}

// fail stops the relay with err.
func (f *failure) fail(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.done)
		f.log.Error("stopping", zap.Error(err))
		if f.stopStream != nil {
			f.stopStream()
		}
	})
}

// background runs the goroutines that store dead letters and parked
// messages; Run, which owns it, closes it at shutdown and waits for them
// before it closes the sink. Safe for concurrent use.
type background struct {
	mu      sync.Mutex
	closing bool
	wg      sync.WaitGroup
}

// start runs f on a goroutine that Run waits for, unless Run is already
// waiting (shutdown): then it reports false and runs nothing.
func (b *background) start(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

// close makes every later start run nothing.
func (b *background) close() {
	b.mu.Lock()
	b.closing = true
	b.mu.Unlock()
}

// wait returns once every goroutine start ran has returned.
func (b *background) wait() { b.wg.Wait() }
