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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/dispatch"
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
	// Batch > 1 turns on batch mode: up to Batch messages, of any
	// aggregates, are processed in one transaction (inbox.ReceiveBatch),
	// each aggregate's in delivery order, and acknowledged only after the
	// commit. A message whose handler fails falls back to its own
	// transaction (retries, then a dead letter) without failing the
	// others. Keep it at or below MaxInFlight; 0 or 1: one transaction per
	// message.
	Batch int
	// LagInterval is how often the consumer's lag, the messages JetStream
	// holds for it (num_pending, not yet delivered, plus num_ack_pending,
	// delivered and not acknowledged), goes to the inbox's Observer.Lag,
	// source stream/consumer; 10s by default.
	LagInterval time.Duration
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
	if cfg.LagInterval <= 0 {
		cfg.LagInterval = 10 * time.Second
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
//
// Beside the deliveries, every inbox.Config.ReplayInterval, it runs the
// replays an operator requested for the inbox's consumer
// (`outboxrelay inbox dlq replay`; inbox.Inbox.ReplayRequested).
func (r *Runner) Run(ctx context.Context) error {
	// Replays an operator requested (outboxrelay inbox dlq replay) run
	// beside the deliveries, with this runner's handler.
	defer dispatch.StartReplays(ctx, r.in, r.h, r.log, what)()
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
	d := r.dispatcher(workCtx, ackWait)
	lagCtx, stopLag := context.WithCancel(ctx)
	lagDone := make(chan struct{})
	go func() { defer close(lagDone); r.reportLag(lagCtx, cons) }()
	defer func() { stopLag(); <-lagDone }()
	for d.Wait(ctx) > 0 {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				break
			}
			r.log.Warn("nats inbox: pull failed", "error", err)
			continue
		}
		h := msg.Headers()
		// Dropped unstarted: JetStream delivers it again after AckWait.
		d.Take(h.Get("aggregate_type")+"\x00"+h.Get("aggregate_id"), msg)
	}
	it.Stop()
	if !d.Drain(r.cfg.DrainTimeout) {
		r.log.Warn("nats inbox: drain timeout; abandoning the handlers still running")
	}
	cancelWork()
	d.Close()
	return nil
}

const what = "nats inbox"

// reportLag reports the consumer's lag every LagInterval until ctx ends.
func (r *Runner) reportLag(ctx context.Context, cons jetstream.Consumer) {
	t := time.NewTicker(r.cfg.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		info, err := cons.Info(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("nats inbox: consumer info for its lag", "error", err)
			}
			continue
		}
		r.in.ReportLag(r.cfg.Stream+"/"+r.cfg.Consumer, int64(info.NumPending)+int64(info.NumAckPending))
	}
}

// dispatcher runs messages through the inbox, one at a time per aggregate
// or in batches, and acknowledges each once its outcome is durable.
func (r *Runner) dispatcher(ctx context.Context, ackWait time.Duration) *dispatch.Dispatcher[jetstream.Msg] {
	ack := func(m jetstream.Msg, res inbox.Result) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := m.DoubleAck(actx); err != nil {
			// JetStream delivers it again; the inbox reports that delivery
			// as a duplicate.
			r.log.Warn("nats inbox: ack failed", "message_id", res.Message.ID, "error", err)
		}
	}
	return dispatch.New(dispatch.Config[jetstream.Msg]{
		MaxInFlight: r.cfg.MaxInFlight,
		Batch:       r.cfg.Batch,
		Process: func(m jetstream.Msg) bool {
			defer inProgress(ackWait, m)()
			res, ok := dispatch.Receive(ctx, r.in, r.h, r.log, what, Raw(m))
			if ok {
				ack(m, res)
			}
			return ok
		},
		ProcessBatch: func(ms []jetstream.Msg) []bool {
			defer inProgress(ackWait, ms...)()
			rs := dispatch.ReceiveBatch(ctx, r.in, r.h, r.log, what, ms, Raw)
			oks := make([]bool, len(ms))
			for i, m := range ms {
				if oks[i] = rs[i].Outcome != 0; oks[i] {
					ack(m, rs[i])
				}
			}
			return oks
		},
	})
}

// inProgress tells the server, every third of ackWait until the returned
// stop is called, that ms are being worked on, so that a slow handler's
// messages are not redelivered meanwhile.
func inProgress(ackWait time.Duration, ms ...jetstream.Msg) (stop func()) {
	if ackWait <= 0 {
		return func() {}
	}
	t := time.NewTicker(ackWait / 3)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range ms {
					_ = m.InProgress()
				}
			}
		}
	}()
	return func() { close(done); t.Stop() }
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
