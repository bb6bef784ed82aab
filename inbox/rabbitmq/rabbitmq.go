// Package rabbitmq runs an inbox over a RabbitMQ queue (amqp091-go).
//
// The Runner consumes one queue with manual acknowledgements and a
// prefetch of Config.Prefetch, processes each delivery through
// inbox.Inbox.Receive, and acknowledges it only when Receive returned a
// durable outcome (processed, duplicate, parked, dead-lettered). Deliveries
// of one aggregate (the aggregate_type and aggregate_id headers the relay
// sets) run one at a time in delivery order; different aggregates run in
// parallel, at most Prefetch at once.
//
// Order across consumers: RabbitMQ hands a queue's messages round-robin to
// its consumers, so two consumers of one queue can each hold a message of
// the same aggregate. Declare the queue with x-single-active-consumer (one
// consumer active, the others standing by) or split aggregates over queues
// (a consistent-hash exchange) when per-aggregate order matters.
//
// A lost connection requeues the unacknowledged deliveries (RabbitMQ does
// that); the Runner stops starting work, drains what runs, and connects
// again. This package is a module of its own so that a RabbitMQ consumer's
// module graph holds no Kafka, NATS or Redis client.
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/inbox/internal/dispatch"
)

// Config configures a Runner.
type Config struct {
	// URL is the AMQP URL, amqp://user:pass@host:5672/vhost.
	URL string
	// Queue is the queue to consume; it must exist.
	Queue string
	// Prefetch is the channel's prefetch count: deliveries held and not
	// acknowledged; 64 by default.
	Prefetch int
	// DrainTimeout is how long a stop or a lost connection waits for
	// running handlers before abandoning them (not acknowledged: RabbitMQ
	// delivers them again); 10s by default.
	DrainTimeout time.Duration
	// LagInterval is how often the queue's lag, its messages ready (a
	// passive declare's count: not yet delivered; AMQP does not report
	// the unacknowledged ones), goes to the inbox's Observer.Lag, source
	// the queue's name; 10s by default.
	LagInterval time.Duration
	// Batch > 1 turns on batch mode: up to Batch deliveries, of any
	// aggregates, are processed in one transaction (inbox.ReceiveBatch),
	// each aggregate's in delivery order, and acknowledged only after the
	// commit. A delivery whose handler fails falls back to its own
	// transaction (retries, then a dead letter) without failing the
	// others. Keep it at or below Prefetch; 0 or 1: one transaction per
	// delivery.
	Batch int
	// Logger, nil for none.
	Logger *slog.Logger
}

// Runner consumes one queue into one Inbox.
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
		return nil, errors.New("rabbitmq inbox: no URL; set Config.URL")
	case cfg.Queue == "":
		return nil, errors.New("rabbitmq inbox: no queue; set Config.Queue")
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 64
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

// Run consumes until ctx is cancelled, then cancels the consumer, waits up
// to DrainTimeout for running handlers, acknowledges what finished and
// returns nil. A lost connection is retried with a growing wait; a queue
// that does not exist is an error.
//
// Beside the deliveries, every inbox.Config.ReplayInterval, it runs the
// replays an operator requested for the inbox's consumer
// (`outboxrelay inbox dlq replay`; inbox.Inbox.ReplayRequested).
func (r *Runner) Run(ctx context.Context) error {
	// Replays an operator requested (outboxrelay inbox dlq replay) run
	// beside the deliveries, with this runner's handler.
	defer dispatch.StartReplays(ctx, r.in, r.h, r.log, what)()
	wait := 100 * time.Millisecond
	for {
		started, err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("rabbitmq inbox: queue %q does not exist; declare it before starting the consumer: %w", r.cfg.Queue, err)
		}
		if started {
			wait = 100 * time.Millisecond
		}
		r.log.Warn("rabbitmq inbox: connection lost; connecting again", "error", err, "wait", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// session consumes over one connection until ctx ends or the connection
// fails, then drains.
func (r *Runner) session(ctx context.Context) (started bool, err error) {
	conn, err := amqp.Dial(r.cfg.URL)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	if err := ch.Qos(r.cfg.Prefetch, 0, false); err != nil {
		return false, err
	}
	const tag = "outboxrelay-inbox"
	deliveries, err := ch.Consume(r.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return false, err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))

	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	d := r.dispatcher(workCtx)
	lagCtx, stopLag := context.WithCancel(ctx)
	lagDone := make(chan struct{})
	go func() { defer close(lagDone); r.reportLag(lagCtx, conn) }()
	defer func() { stopLag(); <-lagDone }()

	var cause error
loop:
	for {
		select {
		case <-ctx.Done():
			_ = ch.Cancel(tag, false) // stop deliveries; those in the prefetch are dropped below
			break loop
		case e := <-closed:
			if e != nil {
				cause = e
			} else {
				cause = errors.New("channel closed")
			}
			break loop
		case dl, ok := <-deliveries:
			if !ok {
				cause = errors.New("delivery channel closed")
				break loop
			}
			// What is dropped unstarted stays unacknowledged: RabbitMQ
			// delivers it again when the channel closes.
			d.Take(aggregate(dl), dl)
		}
	}
	if !d.Drain(r.cfg.DrainTimeout) {
		r.log.Warn("rabbitmq inbox: drain timeout; abandoning the handlers still running")
	}
	cancelWork()
	d.Close()
	return true, cause
}

const what = "rabbitmq inbox"

// reportLag reports the queue's ready messages every LagInterval until ctx
// ends, over a channel of its own (a failed passive declare closes its
// channel; the next tick opens another).
func (r *Runner) reportLag(ctx context.Context, conn *amqp.Connection) {
	t := time.NewTicker(r.cfg.LagInterval)
	defer t.Stop()
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ch == nil || ch.IsClosed() {
			var err error
			if ch, err = conn.Channel(); err != nil {
				ch = nil
				continue // the connection is gone; the session ends too
			}
		}
		q, err := ch.QueueDeclarePassive(r.cfg.Queue, false, false, false, false, nil)
		if err != nil {
			r.log.Warn("rabbitmq inbox: passive declare for the lag", "queue", r.cfg.Queue, "error", err)
			continue
		}
		r.in.ReportLag(r.cfg.Queue, int64(q.Messages))
	}
}

// dispatcher runs deliveries through the inbox, one at a time per
// aggregate or in batches, and acknowledges each once its outcome is
// durable; a delivery not acknowledged is abandoned.
func (r *Runner) dispatcher(ctx context.Context) *dispatch.Dispatcher[amqp.Delivery] {
	ack := func(dl amqp.Delivery, res inbox.Result) bool {
		if err := dl.Ack(false); err != nil {
			// The channel is gone: RabbitMQ delivers it again, and the
			// inbox reports that delivery as a duplicate.
			r.log.Warn("rabbitmq inbox: ack failed", "message_id", res.Message.ID, "error", err)
			return false
		}
		return true
	}
	return dispatch.New(dispatch.Config[amqp.Delivery]{
		// Prefetch bounds what the broker hands over; the channel is
		// never blocked on, so every delivery is taken.
		MaxInFlight: r.cfg.Prefetch,
		Batch:       r.cfg.Batch,
		Process: func(dl amqp.Delivery) bool {
			res, ok := dispatch.Receive(ctx, r.in, r.h, r.log, what, Raw(dl))
			return ok && ack(dl, res)
		},
		ProcessBatch: func(dls []amqp.Delivery) []bool {
			rs := dispatch.ReceiveBatch(ctx, r.in, r.h, r.log, what, dls, Raw)
			oks := make([]bool, len(dls))
			for i, dl := range dls {
				oks[i] = rs[i].Outcome != 0 && ack(dl, rs[i])
			}
			return oks
		},
	})
}

func aggregate(d amqp.Delivery) string {
	t, _ := d.Headers["aggregate_type"].(string)
	id, _ := d.Headers["aggregate_id"].(string)
	return t + "\x00" + id
}

// Raw maps a delivery onto the inbox's broker-independent input: the
// headers as strings, and the AMQP properties that carry the relay's
// values under the relay's header names (message-id as message_id, type as
// event_type, content-type as content-type).
func Raw(d amqp.Delivery) inbox.Raw {
	h := make(map[string]string, len(d.Headers)+3)
	for k, v := range d.Headers {
		switch v := v.(type) {
		case string:
			h[k] = v
		case []byte:
			h[k] = string(v)
		default:
			h[k] = fmt.Sprint(v)
		}
	}
	if d.MessageId != "" {
		h["message_id"] = d.MessageId
	}
	if d.Type != "" {
		h["event_type"] = d.Type
	}
	if d.ContentType != "" {
		h["content-type"] = d.ContentType
	}
	return inbox.Raw{Value: d.Body, Headers: h}
}
