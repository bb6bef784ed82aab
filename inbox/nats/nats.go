// Package nats runs an inbox over a NATS JetStream durable pull consumer
// (nats.go/jetstream).
//
// The Runner pulls from an existing durable consumer with explicit acks,
// processes each message through inbox.Inbox.Receive and acknowledges it
// (a double ack: the server confirms it) only when Receive returned a
// durable outcome. Messages of one aggregate (the aggregate_type and
// aggregate_id headers the relay sets) run one at a time in delivery
// order, different aggregates in parallel, at most Config.MaxInFlight
// pulled and unfinished. While a handler runs past a third of the
// consumer's AckWait, the Runner tells the server it is in progress, so a
// slow handler is not redelivered meanwhile.
//
// Order across processes: JetStream spreads one consumer's messages over
// every process pulling from it; run one process per durable consumer (or
// split aggregates over subjects and consumers) when per-aggregate order
// matters. A message not acknowledged within AckWait, because its process
// died, is delivered again; the inbox reports it as a duplicate if it had
// committed.
//
// This package is a module of its own so that a NATS consumer's module
// graph holds no Kafka, AMQP or Redis client.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// Config configures a Runner.
type Config struct {
	// URL is the NATS server URL, nats://host:4222.
	URL string
	// Stream and Consumer name an existing durable pull consumer with
	// AckPolicy explicit.
	Stream, Consumer string
	// MaxInFlight bounds the messages pulled and not finished; 64 by
	// default. Keep the consumer's MaxAckPending at least as large.
	MaxInFlight int
	// DrainTimeout is how long a stop waits for running handlers before
	// abandoning them (not acknowledged: JetStream delivers them again
	// after AckWait); 10s by default.
	DrainTimeout time.Duration
	// Options are further nats.Connect options (credentials, TLS).
	Options []nats.Option
	// Logger, nil for none.
	Logger *slog.Logger
}

// Runner consumes one durable consumer into one Inbox.
type Runner struct {
	cfg Config
	in  *inbox.Inbox
	h   inbox.Handler
	log *slog.Logger
}

// New returns a Runner; it starts nothing, Run does.
func New(in *inbox.Inbox, h inbox.Handler, cfg Config) (*Runner, error) {
	switch {
	case cfg.URL == "":
		return nil, errors.New("nats inbox: no URL; set Config.URL")
	case cfg.Stream == "" || cfg.Consumer == "":
		return nil, errors.New("nats inbox: no stream or consumer; set Config.Stream and Config.Consumer")
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, in: in, h: h, log: log}, nil
}

// Run consumes until ctx is cancelled, then stops pulling, waits up to
// DrainTimeout for running handlers, acknowledges what finished and
// returns nil. A consumer that does not exist is an error; the connection
// reconnects by itself (nats.go).
func (r *Runner) Run(ctx context.Context) error {
	nc, err := nats.Connect(r.cfg.URL, r.cfg.Options...)
	if err != nil {
		return fmt.Errorf("nats inbox: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats inbox: %w", err)
	}
	cons, err := js.Consumer(ctx, r.cfg.Stream, r.cfg.Consumer)
	if err != nil {
		return fmt.Errorf("nats inbox: consumer %s on stream %s: %w; create it (durable, AckPolicy explicit) first", r.cfg.Consumer, r.cfg.Stream, err)
	}
	ackWait := cons.CachedInfo().Config.AckWait
	// Messages another process took and never acknowledged (it died) come
	// back only after AckWait, and JetStream would hand this process their
	// successors first: an aggregate's later message would run before its
	// earlier one. Wait until they are due; JetStream then delivers them
	// before new messages.
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("nats inbox: consumer %s: %w", r.cfg.Consumer, err)
	}
	if info.NumAckPending > 0 && ackWait > 0 {
		r.log.Info("nats inbox: waiting for unacknowledged messages to be redelivered first",
			"pending", info.NumAckPending, "ack_wait", ackWait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(ackWait):
		}
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(r.cfg.MaxInFlight))
	if err != nil {
		return fmt.Errorf("nats inbox: pull from %s: %w", r.cfg.Consumer, err)
	}
	stopPull := context.AfterFunc(ctx, it.Stop)
	defer stopPull()

	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	s := &session{r: r, ctx: workCtx, ackWait: ackWait, queues: map[string][]jetstream.Msg{}}
	s.cond = sync.NewCond(&s.mu)
	for {
		s.mu.Lock()
		for s.inflight >= r.cfg.MaxInFlight && ctx.Err() == nil {
			s.cond.Wait()
		}
		s.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				break
			}
			r.log.Warn("nats inbox: pull failed", "error", err)
			continue
		}
		s.take(msg)
	}
	it.Stop()
	s.drain()
	cancelWork()
	s.workers.Wait()
	return nil
}

type session struct {
	r        *Runner
	ctx      context.Context
	ackWait  time.Duration
	mu       sync.Mutex
	cond     *sync.Cond
	queues   map[string][]jetstream.Msg
	inflight int
	stopping bool
	workers  sync.WaitGroup
}

func (s *session) take(m jetstream.Msg) {
	h := m.Headers()
	k := h.Get("aggregate_type") + "\x00" + h.Get("aggregate_id")
	s.mu.Lock()
	defer s.mu.Unlock()
	q, running := s.queues[k]
	s.queues[k] = append(q, m)
	s.inflight++
	if !running {
		s.workers.Add(1)
		go s.work(k)
	}
}

func (s *session) work(k string) {
	defer s.workers.Done()
	for {
		s.mu.Lock()
		q := s.queues[k]
		if len(q) == 0 || s.stopping {
			delete(s.queues, k) // not started: JetStream delivers it again after AckWait
			s.inflight -= len(q)
			s.cond.Broadcast()
			s.mu.Unlock()
			return
		}
		m := q[0]
		s.mu.Unlock()

		ok := s.process(m)

		s.mu.Lock()
		s.queues[k] = s.queues[k][1:]
		s.inflight--
		if !ok {
			s.inflight -= len(s.queues[k])
			delete(s.queues, k)
		}
		s.cond.Broadcast()
		s.mu.Unlock()
		if !ok {
			return
		}
	}
}

// process runs m through the inbox and acknowledges it once the outcome is
// durable; false means abandoned (not acknowledged).
func (s *session) process(m jetstream.Msg) bool {
	if s.ackWait > 0 {
		t := time.NewTicker(s.ackWait / 3)
		done := make(chan struct{})
		defer func() { close(done); t.Stop() }()
		go func() {
			for {
				select {
				case <-done:
					return
				case <-t.C:
					_ = m.InProgress()
				}
			}
		}()
	}
	raw := Raw(m)
	wait := 100 * time.Millisecond
	for {
		res, err := s.r.in.Receive(s.ctx, raw, s.r.h)
		if err == nil {
			if res.Outcome == inbox.DeadLettered {
				s.r.log.Warn("nats inbox: message dead-lettered", "message_id", res.Message.ID, "error", res.Err)
			}
			actx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
			defer cancel()
			if err := m.DoubleAck(actx); err != nil {
				// JetStream delivers it again; the inbox reports that
				// delivery as a duplicate.
				s.r.log.Warn("nats inbox: ack failed", "message_id", res.Message.ID, "error", err)
			}
			return true
		}
		if s.ctx.Err() != nil {
			return false
		}
		s.r.log.Warn("nats inbox: processing failed, retrying", "error", err)
		select {
		case <-s.ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

func (s *session) drain() {
	timer := time.AfterFunc(s.r.cfg.DrainTimeout, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(s.r.cfg.DrainTimeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	s.cond.Broadcast()
	for s.inflight > 0 && time.Now().Before(deadline) {
		s.cond.Wait()
	}
	if s.inflight > 0 {
		s.r.log.Warn("nats inbox: drain timeout; abandoning the handlers still running")
	}
}

// Raw maps a JetStream message onto the inbox's broker-independent input:
// the first value of each header, and the data as the body.
func Raw(m jetstream.Msg) inbox.Raw {
	h := make(map[string]string, len(m.Headers()))
	for k, vs := range m.Headers() {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	return inbox.Raw{Value: m.Data(), Headers: h}
}
