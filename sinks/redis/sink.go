package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ relay.Sink   = (*Sink)(nil)
	_ relay.Runner = (*Sink)(nil)
)

// Field names of stream entries. The relay-owned fields come first, in the
// order of sinks.Redis (see sinks.Binding.Headers): message_id, event_type,
// aggregate_id, aggregate_type, traceparent, tracestate when set,
// content-type, and in CloudEvents binary mode the ce_ attributes; then
// headers, the row's headers as a JSON object (only when the row has any),
// then envelope, the body.
const (
	FieldMessageID     = sinks.HeaderMessageID
	FieldEventType     = sinks.HeaderEventType
	FieldAggregateID   = sinks.HeaderAggregateID
	FieldAggregateType = sinks.HeaderAggregateType
	FieldTraceparent   = sinks.HeaderTraceparent
	FieldContentType   = sinks.HeaderContentType
	FieldHeaders       = "headers"
	FieldEnvelope      = "envelope"
)

// ErrClosed is reported for messages whose outcome was still open when the
// sink stopped; it matches sinks.ErrClosed too. It is retryable.
var ErrClosed = sinks.Closed("redis sink closed before the message was appended")

const (
	retryMin = 100 * time.Millisecond
	retryMax = 10 * time.Second
	// healthInterval is how often an idle Run pings the server, so that
	// Ready notices a lost server without traffic.
	healthInterval = 5 * time.Second
)

// Sink appends relay messages to Redis streams. Create it with New,
// optionally call Connect, run Run for as long as it relays (Publish only
// queues), and Close it. It is safe for concurrent use. See the package
// documentation for its guarantees.
type Sink struct {
	cfg    Config
	log    *zap.Logger
	stream template
	client *goredis.Client
	queue  chan *item

	mu         sync.RWMutex   // orders Publish's enqueue against Close
	publishers sync.WaitGroup // Publish calls past the closed check

	run   *sinks.Lifecycle // stopped by Close under mu
	ready atomic.Bool
}

// item is one message between Publish and its outcome.
type item struct {
	m    *relay.Message
	done func(*relay.Message, error)
	args goredis.XAddArgs
	vals [36]any
}

// New checks cfg, applies its defaults and returns a Sink. It neither dials
// nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	stream, err := parseTemplate(cfg.Stream)
	if err != nil {
		return nil, err // Validate has checked it
	}
	opts, err := goredis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink.redis.url: %w", redact.Error(err, cfg.URL))
	}
	opts.ClientName = "outboxrelay"
	opts.DialTimeout = cfg.DialTimeout
	opts.ReadTimeout = cfg.Timeout
	opts.WriteTimeout = cfg.Timeout
	// The sink retries whole batches, in order, with backoff: a second
	// layer of retries inside go-redis would only resend batches behind
	// its back.
	opts.MaxRetries = -1
	// Batches go one at a time; a second connection serves Ping.
	opts.PoolSize = 2
	opts.DisableIdentity = true // CLIENT SETINFO is noise on servers before 7.2
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS.Clone()
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Sink{
		cfg:    cfg,
		log:    log.Named("redis"),
		stream: stream,
		client: goredis.NewClient(opts),
		queue:  make(chan *item, cfg.MaxInFlight),
		run:    sinks.NewLifecycle("redis"),
	}, nil
}

// Connect pings the server once, so that an unreachable server or a wrong
// password at start is one clear error (password redacted). It is
// optional: Run connects on its own. ctx bounds the attempt.
func (s *Sink) Connect(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		s.ready.Store(false)
		return fmt.Errorf("cannot reach redis at %s (%w); check sink.redis.url and that the server is running and reachable",
			redact.URL(s.cfg.URL), redact.Error(err, s.cfg.URL))
	}
	s.ready.Store(!s.run.Stopped())
	return nil
}

// Publish renders m's stream key, sets m.Destination to it and queues m for
// Run; done is called exactly once, from Run's goroutine once the batch
// holding m has been executed, or before Publish returns: with a
// relay.Permanent error when no row may write to the key or a field is not
// valid UTF-8, and when ctx ends or the sink is closed first (ctx.Err() or
// ErrClosed, both retryable). done must not block. Publish blocks while
// Config.MaxInFlight messages are queued. Messages are appended in the order
// of the Publish calls.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	key, err := s.stream.render(m)
	m.Destination = key
	if err != nil {
		done(m, relay.Permanent(err))
		return
	}
	it, err := newItem(m, done, key, s.cfg.MaxLen)
	if err != nil {
		done(m, relay.Permanent(fmt.Errorf("append to redis stream %q: %w", key, err)))
		return
	}
	if err := ctx.Err(); err != nil {
		done(m, err)
		return
	}
	s.mu.RLock()
	if s.run.Stopped() {
		s.mu.RUnlock()
		done(m, ErrClosed)
		return
	}
	s.publishers.Add(1)
	s.mu.RUnlock()
	defer s.publishers.Done()

	select {
	case s.queue <- it:
	case <-ctx.Done():
		done(m, ctx.Err())
	case <-s.run.Quit():
		done(m, ErrClosed)
	}
}

// newItem builds m's XADD. One allocation holds the arguments; the
// envelope is passed as it is. It fails when a field name or value is not
// valid UTF-8 (sinks.CheckHeaders).
func newItem(m *relay.Message, done func(*relay.Message, error), key string, maxLen int64) (*item, error) {
	it := &item{m: m, done: done}
	var own [16]envelope.Header
	hs, n := sinks.Redis.Headers(own[:0], m)
	if err := sinks.CheckHeaders(hs); err != nil {
		return nil, err
	}
	v := it.vals[:0]
	for _, h := range hs[:n] {
		v = append(v, h.Key, h.Value)
	}
	if row := hs[n:]; len(row) > 0 {
		v = append(v, FieldHeaders, headersJSON(row))
	}
	v = append(v, FieldEnvelope, m.Envelope)
	it.args = goredis.XAddArgs{Stream: key, ID: "*", Values: v}
	if maxLen > 0 {
		it.args.MaxLen = maxLen
		it.args.Approx = true
	}
	return it, nil
}

// headersJSON encodes the row's headers as a JSON object in row order.
func headersJSON(hs []envelope.Header) []byte {
	b := make([]byte, 0, 64*len(hs))
	b = append(b, '{')
	for i, h := range hs {
		if i > 0 {
			b = append(b, ',')
		}
		k, _ := json.Marshal(h.Key) // a string never fails
		v, _ := json.Marshal(h.Value)
		b = append(b, k...)
		b = append(b, ':')
		b = append(b, v...)
	}
	return append(b, '}')
}

// Run sends the queued messages in batches until ctx is done or the sink
// is closed, then returns nil; messages still queued are reported by
// Close. A batch in flight when the sink is closed is finished first;
// cancelling ctx abandons it, reporting its messages with ctx's error. Run
// may be called once.
func (s *Sink) Run(ctx context.Context) error {
	if err := s.run.Enter(); err != nil {
		return err
	}
	defer s.run.Exit()

	batch := make([]*item, 0, s.cfg.BatchSize)
	health := time.NewTicker(healthInterval)
	defer health.Stop()
	for {
		select {
		case it := <-s.queue:
			batch = append(batch, it)
		case <-health.C:
			s.ping(ctx)
			continue
		case <-ctx.Done():
			return nil
		case <-s.run.Quit():
			return nil
		}
	fill:
		for len(batch) < cap(batch) {
			select {
			case it := <-s.queue:
				batch = append(batch, it)
			default:
				break fill
			}
		}
		s.send(ctx, batch)
		clear(batch)
		batch = batch[:0]
	}
}

func (s *Sink) ping(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	err := s.client.Ping(pctx).Err()
	if err != nil && ctx.Err() == nil {
		s.log.Warn("redis ping failed", zap.Error(redact.Error(err, s.cfg.URL)))
	}
	s.ready.Store(err == nil && !s.run.Stopped())
}

// send executes batch as one MULTI/EXEC until it goes through, reporting
// every message's outcome. Between attempts it backs off; Close ends the
// retries (not an attempt in flight), ctx ends both.
func (s *Sink) send(ctx context.Context, batch []*item) {
	bo := backoff.Backoff{Min: retryMin, Max: retryMax}
	for attempt := 1; ; attempt++ {
		cmds, replicated, err := s.exec(ctx, batch)
		if err == nil || !batchFailed(cmds, err) {
			s.ready.Store(replicated == nil && !s.run.Stopped())
			for i, it := range batch {
				err := appendError(it.args.Stream, cmds[i].Err())
				if err == nil && replicated != nil {
					err = fmt.Errorf("append to redis stream %q: %w", it.args.Stream, replicated)
				}
				it.done(it.m, err)
			}
			return
		}
		err = redact.Error(err, s.cfg.URL)
		if ctx.Err() != nil {
			s.fail(batch, ctx.Err())
			return
		}
		s.ready.Store(false)
		wait := bo.Next()
		s.log.Warn("redis batch failed; sending it again", zap.Int("messages", len(batch)),
			zap.Int("attempt", attempt), zap.Duration("retry_in", wait), zap.Error(err))
		if !s.run.Sleep(ctx, wait) {
			s.fail(batch, fmt.Errorf("append to redis: %w (last error: %w)", ErrClosed, err))
			return
		}
	}
}

// exec appends batch in one MULTI/EXEC. With sink.redis.wait_replicas it
// then sends WAIT on the same connection (WAIT counts the replicas that
// have the connection's writes): replicated is the retryable error of a
// batch the primary holds but too few replicas acknowledged in time.
func (s *Sink) exec(ctx context.Context, batch []*item) (cmds []goredis.Cmder, replicated, err error) {
	appendAll := func(p goredis.Pipeliner) error {
		for _, it := range batch {
			p.XAdd(ctx, &it.args)
		}
		return nil
	}
	if s.cfg.WaitReplicas == 0 {
		cmds, err = s.client.TxPipelined(ctx, appendAll)
		return cmds, nil, err
	}
	conn := s.client.Conn()
	defer conn.Close()
	cmds, err = conn.TxPipelined(ctx, appendAll)
	if err != nil && batchFailed(cmds, err) {
		return cmds, nil, err
	}
	n, werr := conn.Wait(ctx, s.cfg.WaitReplicas, s.cfg.WaitTimeout).Result()
	switch {
	case werr != nil:
		replicated = fmt.Errorf("wait for %d replicas: %w", s.cfg.WaitReplicas, redact.Error(werr, s.cfg.URL))
	case n < int64(s.cfg.WaitReplicas):
		replicated = fmt.Errorf("%w: %d of the %d replicas sink.redis.wait_replicas asks for acknowledged it within sink.redis.wait_timeout %s; check the replicas (INFO replication) or lower sink.redis.wait_replicas",
			ErrTooFewReplicas, n, s.cfg.WaitReplicas, s.cfg.WaitTimeout)
	}
	if replicated != nil && ctx.Err() == nil {
		s.log.Warn("redis batch not acknowledged by enough replicas; its messages are retried", zap.Int("messages", len(batch)), zap.Error(replicated))
	}
	return cmds, replicated, err
}

// ErrTooFewReplicas is reported (retryable) for a message appended on the
// primary that fewer replicas than sink.redis.wait_replicas acknowledged
// within sink.redis.wait_timeout: the primary may lose it in a failover.
var ErrTooFewReplicas = errors.New("redis appended the message but too few replicas acknowledged it")

// batchFailed reports whether the transaction as a whole failed, so that
// nothing of it was appended and it must be sent again: the connection
// failed, or the server refused it at EXEC. A refusal of single commands
// inside EXEC (WRONGTYPE) leaves the rest appended.
func batchFailed(cmds []goredis.Cmder, err error) bool {
	if len(cmds) == 0 {
		return true
	}
	for _, c := range cmds {
		if e := c.Err(); e == nil || permanent(e) {
			return false
		}
	}
	return err != nil
}

func (s *Sink) fail(batch []*item, err error) {
	for _, it := range batch {
		it.done(it.m, fmt.Errorf("append to redis stream %q: %w", it.args.Stream, err))
	}
}

// permanent reports whether Redis will refuse this XADD however often it is
// sent: the key holds another type than a stream. Everything else a batch
// can meet (connection errors, timeouts, OOM, READONLY, LOADING, NOPERM,
// BUSY) is about the server or its configuration and passes. This is the
// one place that decides.
func permanent(err error) bool {
	return goredis.HasErrorPrefix(err, "WRONGTYPE")
}

// appendError is the error reported for one XADD: nil, or err marked
// relay.Permanent when Redis will never take it.
func appendError(key string, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("append to redis stream %q: %w", key, err)
	if permanent(err) {
		return relay.Permanent(err)
	}
	return err
}

// Ready reports whether the latest batch or ping succeeded; false before the
// first one (call Connect), while batches fail and after Close. It does not
// block.
func (s *Sink) Ready() bool { return s.ready.Load() }

// Close stops Run (after the batch in flight, if any), reports every queued
// message with ErrClosed (retryable) and closes the connections. Every done
// has been called when Close returns. Publish calls after Close report
// ErrClosed. Close is idempotent and safe for concurrent use.
func (s *Sink) Close() error {
	if !s.run.Stop(&s.mu) {
		return nil
	}
	s.ready.Store(false)
	s.publishers.Wait()
	for {
		select {
		case it := <-s.queue:
			it.done(it.m, fmt.Errorf("append to redis stream %q: %w", it.args.Stream, ErrClosed))
			continue
		default:
		}
		break
	}
	if err := s.client.Close(); err != nil && !errors.Is(err, goredis.ErrClosed) {
		return fmt.Errorf("close redis client: %w", err)
	}
	return nil
}
