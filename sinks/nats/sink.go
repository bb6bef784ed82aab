package nats

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// Header keys the sink sets on every message: the JetStream ones, then
// those of sinks.NATS (see sinks.Binding.Headers for the whole set and its
// order), which include the CloudEvents attributes with the ce- prefix of
// the NATS binding in binary content mode. A row header starting with
// Nats- fails the message permanently: such headers steer the server.
const (
	HeaderMsgID          = "Nats-Msg-Id"
	HeaderExpectedStream = "Nats-Expected-Stream"
	HeaderMessageID      = sinks.HeaderMessageID
	HeaderEventType      = sinks.HeaderEventType
	HeaderAggregateID    = sinks.HeaderAggregateID
	HeaderAggregateType  = sinks.HeaderAggregateType
	HeaderTraceparent    = sinks.HeaderTraceparent
	HeaderContentType    = sinks.HeaderContentType
)

// Bounds of the backoff between republications of messages the server
// refused, or did not acknowledge in time, on a live connection.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 10 * time.Second
	// pollConnected is how often a Publish waiting for a reconnect looks
	// at the connection.
	pollConnected = 20 * time.Millisecond
)

// conn is one connection and its JetStream context, set once by Connect.
type conn struct {
	nc *natsgo.Conn
	js jetstream.JetStream
}

// Sink publishes relay messages to a NATS JetStream stream. Create it with
// New, call Connect, run Run for as long as it relays, and Close it. It is
// safe for concurrent use. See the package documentation for its guarantees.
type Sink struct {
	cfg     Config
	log     *zap.Logger
	subject template
	slots   chan struct{} // one token per message between Publish and done
	kick    chan struct{} // wakes Run when messages wait to be republished

	conn atomic.Pointer[conn]

	// sendMu serialises sending, so that messages that must be published
	// again go out before any newer message. Taken before mu.
	sendMu sync.Mutex

	mu      sync.Mutex
	byMsg   map[*natsgo.Msg]*pending // the attempt in flight -> its message
	queue   []*pending               // open messages in publish order; resolved ones are skipped
	open    int                      // unresolved messages in queue
	lost    int                      // unresolved messages with no attempt in flight
	gen     uint64                   // reconnect count the attempts in flight were sent on
	retryAt time.Time                // no republication before
	backoff backoff.Backoff          // pause before the next republication; reset by an ack

	run     *sinks.Lifecycle // stopped by Close under mu
	failing atomic.Bool
}

// pending is one message between Publish and its outcome. Its fields but m
// and done are guarded by Sink.mu.
type pending struct {
	m    *relay.Message
	done func(*relay.Message, error)
	hdr  natsgo.Header
	msg  *natsgo.Msg // the attempt in flight, nil when none
	// resolved is set once done has been (or is being) called.
	resolved bool
}

// New checks cfg, applies its defaults and returns a Sink. It neither dials
// nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	subject, err := parseTemplate(cfg.Subject)
	if err != nil {
		return nil, err // Validate has checked it
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Sink{
		cfg:     cfg,
		log:     log.Named("nats"),
		subject: subject,
		slots:   make(chan struct{}, cfg.MaxInFlight),
		kick:    make(chan struct{}, 1),
		byMsg:   make(map[*natsgo.Msg]*pending),
		run:     sinks.NewLifecycle("nats"),
		backoff: backoff.Backoff{Min: retryMin, Max: retryMax},
	}, nil
}

// Connect dials the servers, then checks that Config.Stream exists and
// captures the template's subjects, creating it when Config.CreateStream is
// set. It is one attempt: an unreachable server or a missing stream is an
// error that names the fix (credentials redacted). Once connected, nats.go
// reconnects on its own, forever. Calling Connect again after it succeeded
// does nothing. ctx bounds the stream check; the dial is bounded by
// Config.DialTimeout.
func (s *Sink) Connect(ctx context.Context) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.run.Stopped() {
		return ErrClosed
	}
	if s.conn.Load() != nil {
		return nil
	}
	opts := []natsgo.Option{
		natsgo.Name(s.cfg.ClientName),
		natsgo.Timeout(s.cfg.DialTimeout),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(s.cfg.ReconnectWait),
		// No reconnect buffer: a publish while disconnected fails at
		// once instead of being replayed by nats.go after the reconnect,
		// ahead of the messages the sink must republish first.
		natsgo.ReconnectBufSize(-1),
		natsgo.NoCallbacksAfterClientClose(),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			s.log.Warn("disconnected from nats; reconnecting", zap.Error(redact.Error(err, s.cfg.URL)))
		}),
		natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
			s.log.Info("reconnected to nats", zap.String("server", redact.URL(nc.ConnectedUrl())))
			s.wake()
		}),
		natsgo.ErrorHandler(func(_ *natsgo.Conn, _ *natsgo.Subscription, err error) {
			s.log.Warn("nats error", zap.Error(redact.Error(err, s.cfg.URL)))
		}),
	}
	if s.cfg.CredentialsFile != "" {
		opts = append(opts, natsgo.UserCredentials(s.cfg.CredentialsFile))
	}
	if s.cfg.TLS != nil {
		opts = append(opts, natsgo.Secure(s.cfg.TLS.Clone()))
	}
	nc, err := natsgo.Connect(s.cfg.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to nats at %s: %w; check sink.nats.url and that the server is running and reachable",
			redact.URL(s.cfg.URL), redact.Error(err, s.cfg.URL))
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncAckHandler(s.acked),
		jetstream.WithPublishAsyncErrHandler(s.failed),
		// Attempts that were superseded by a republication stay in
		// nats.go's table until they time out; the sink's own slots bound
		// the messages.
		jetstream.WithPublishAsyncMaxPending(4*s.cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(s.cfg.AckTimeout),
	)
	if err == nil {
		err = s.ensureStream(ctx, js)
	}
	if err != nil {
		nc.Close()
		return err
	}
	s.mu.Lock()
	s.gen = nc.Stats().Reconnects
	s.mu.Unlock()
	s.conn.Store(&conn{nc: nc, js: js})
	return nil
}

// ensureStream checks that the stream exists, creating it if configured to.
func (s *Sink) ensureStream(ctx context.Context, js jetstream.JetStream) error {
	name := s.cfg.Stream
	st, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && s.cfg.CreateStream:
		subjects := s.subject.streamSubjects()
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:       name,
			Subjects:   subjects,
			Storage:    jetstream.FileStorage,
			Retention:  jetstream.LimitsPolicy,
			Duplicates: s.cfg.DuplicateWindow,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil // created concurrently
		}
		if err != nil {
			return fmt.Errorf("create nats stream %s on %s: %w", name, strings.Join(subjects, ","), err)
		}
		s.log.Info("created nats stream", zap.String("stream", name), zap.Strings("subjects", subjects),
			zap.Duration("duplicate_window", s.cfg.DuplicateWindow))
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("nats stream %s does not exist; create it to capture %s, or set sink.nats.create_stream: true",
			name, strings.Join(s.subject.streamSubjects(), ","))
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("jetstream is not enabled on the nats server; start nats-server with -js (or enable jetstream for the account): %w", err)
	case err != nil:
		return fmt.Errorf("look up nats stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	shape := s.subject.shape()
	captured := false
	for _, f := range info.Config.Subjects {
		if subjectMatches(f, shape) {
			captured = true
			break
		}
	}
	if !captured {
		s.log.Warn("the nats stream's subjects do not capture every subject of the template; messages to other subjects fail with no responders or a permanent error",
			zap.String("stream", name), zap.Strings("stream_subjects", info.Config.Subjects), zap.String("subject", s.cfg.Subject))
	}
	if info.Config.Duplicates <= 0 {
		s.log.Warn("the nats stream has no duplicate window; republished messages are stored twice", zap.String("stream", name))
	}
	return nil
}

// Run republishes, in publish order, the messages whose attempt was lost
// with a connection or refused for a moment, as soon as the connection and
// the backoff allow, and dials when Connect was not called or failed. It
// returns nil when ctx is done or the sink is closed. Messages still open
// then are reported by Close.
func (s *Sink) Run(ctx context.Context) error {
	if err := s.run.Enter(); err != nil {
		return err
	}
	defer s.run.Exit()
	ctx, cancel := s.run.Context(ctx)
	defer cancel()

	bo := backoff.Backoff{Min: retryMin, Max: retryMax}
	for s.conn.Load() == nil {
		err := s.Connect(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return nil
		}
		wait := bo.Next()
		s.log.Warn("cannot connect to nats, retrying", zap.Error(err), zap.Duration("retry_in", wait))
		if !sinks.Sleep(ctx, wait) {
			return nil
		}
	}

	// A reconnect without traffic is noticed by the periodic check, in case
	// nats.go's reconnect callback is late.
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-t.C:
		}
		s.sendMu.Lock()
		err := s.sync(ctx)
		s.sendMu.Unlock()
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrClosed) {
			s.log.Warn("republish failed", zap.Error(err))
		}
	}
}

// Publish renders m's subject, sets m.Destination to it and publishes m
// asynchronously; done is called exactly once, possibly before Publish
// returns, otherwise from a nats.go goroutine. done must not block.
//
// done receives nil once the stream has stored m (or acknowledged it as a
// duplicate of a message id it stored within its duplicate window), a
// relay.Permanent error when the server will never store m (see the package
// documentation), ctx.Err() when ctx ends while Publish waits, and ErrClosed
// when the sink is closed first. Publish blocks while Config.MaxInFlight
// messages are unacknowledged, while disconnected, and while messages wait
// to be republished, until ctx is done. Messages are sent in the order of
// the Publish calls.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	subject, err := s.subject.render(m)
	m.Destination = subject
	if err != nil {
		done(m, relay.Permanent(err))
		return
	}
	hdr, err := s.header(m)
	if err != nil {
		done(m, relay.Permanent(fmt.Errorf("publish to nats subject %q: %w", subject, err)))
		return
	}
	if err := ctx.Err(); err != nil {
		done(m, err)
		return
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		done(m, ctx.Err())
		return
	case <-s.run.Quit():
		done(m, ErrClosed)
		return
	}

	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if err := s.sync(ctx); err != nil {
		<-s.slots
		done(m, err)
		return
	}
	p := &pending{m: m, done: done, hdr: hdr}
	msg := &natsgo.Msg{Subject: subject, Header: hdr, Data: m.Envelope}
	s.mu.Lock()
	if s.run.Stopped() {
		s.mu.Unlock()
		<-s.slots
		done(m, ErrClosed)
		return
	}
	s.queue = append(s.queue, p)
	s.open++
	p.msg = msg
	s.byMsg[msg] = p
	s.mu.Unlock()
	s.send(s.conn.Load(), msg)
}

// header builds m's headers. The map is shared by every attempt of m;
// nats.go only reads it. It fails, naming the header and the rule, for a
// header NATS cannot carry: a Nats-* name, a name nats.go refuses (which
// it reports only as "could not decode headers"), or a name or value that
// is not valid UTF-8.
func (s *Sink) header(m *relay.Message) (natsgo.Header, error) {
	hs, _ := sinks.NATS.Headers(make([]envelope.Header, 0, len(m.Headers)+len(m.Attributes)+8), m)
	h := make(natsgo.Header, len(hs)+2)
	for _, x := range hs {
		if len(x.Key) >= 5 && strings.EqualFold(x.Key[:5], "nats-") {
			return nil, fmt.Errorf("row header %q is reserved: Nats-* headers steer the JetStream server", x.Key)
		}
		if i := strings.IndexFunc(x.Key, badHeaderNameRune); i >= 0 || x.Key == "" {
			return nil, fmt.Errorf("header name %q cannot be sent over NATS, whose header names are printable ASCII without spaces or any of %s; rename the row header", x.Key, headerNameSpecials)
		}
		h[x.Key] = []string{x.Value}
	}
	if err := sinks.CheckHeaders(hs); err != nil {
		return nil, err
	}
	for _, x := range hs {
		// nats.go would send another value: it trims the whitespace around
		// a value and turns CR and LF into spaces.
		if strings.ContainsAny(x.Value, "\r\n") || textproto.TrimString(x.Value) != x.Value {
			return nil, fmt.Errorf("header %q value %q starts or ends with whitespace or holds a line break, which NATS headers cannot carry unchanged; remove them from the row's value", x.Key, x.Value)
		}
	}
	h[HeaderMsgID] = []string{m.ID}
	h[HeaderExpectedStream] = []string{s.cfg.Stream}
	return h, nil
}

// headerNameSpecials are the printable ASCII characters nats.go refuses in
// a header name (ErrBadHeaderMsg), beyond the colon that NATS's header
// format (ADR-4) excludes.
const headerNameSpecials = `"()/,:;<=>?@[\]{}`

// badHeaderNameRune reports whether r cannot be part of a NATS header
// name: anything but printable ASCII (33 to 126), and headerNameSpecials.
func badHeaderNameRune(r rune) bool {
	return r <= ' ' || r > '~' || strings.ContainsRune(headerNameSpecials, r)
}

// sync runs before every send, under sendMu: it waits for a connection and,
// when messages are waiting to be republished (their attempt failed, or was
// sent on a connection that has since been replaced), republishes them in
// publish order once the backoff allows. It returns ctx.Err() or ErrClosed
// when those end the wait first.
func (s *Sink) sync(ctx context.Context) error {
	for {
		c, err := s.waitConnected(ctx)
		if err != nil {
			return err
		}
		gen := c.nc.Stats().Reconnects
		s.mu.Lock()
		if s.run.Stopped() {
			s.mu.Unlock()
			return ErrClosed
		}
		if gen != s.gen {
			// Every attempt in flight went out on a connection that is
			// gone. The stream stored a prefix of them, if any: sending
			// them all again, in order, keeps the order, and the duplicate
			// window drops the prefix.
			s.gen = gen
			for msg, p := range s.byMsg {
				delete(s.byMsg, msg)
				p.msg = nil
				s.lost++
			}
			s.retryAt = time.Time{}
		}
		if s.lost == 0 {
			s.failing.Store(false)
			s.mu.Unlock()
			return nil
		}
		if wait := time.Until(s.retryAt); wait > 0 {
			s.mu.Unlock()
			if !s.run.Sleep(ctx, wait) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return ErrClosed
			}
			continue
		}
		var resend []*natsgo.Msg
		for _, p := range s.queue {
			if p.resolved || p.msg != nil {
				continue
			}
			p.msg = &natsgo.Msg{Subject: p.m.Destination, Header: p.hdr, Data: p.m.Envelope}
			s.byMsg[p.msg] = p
			resend = append(resend, p.msg)
		}
		s.lost = 0
		s.mu.Unlock()
		s.log.Info("republishing messages", zap.Int("messages", len(resend)))
		for _, msg := range resend {
			s.send(c, msg)
		}
	}
}

// waitConnected returns the connection once it is connected.
func (s *Sink) waitConnected(ctx context.Context) (*conn, error) {
	var t *time.Ticker
	for {
		if c := s.conn.Load(); c != nil && c.nc.IsConnected() {
			if t != nil {
				t.Stop()
			}
			return c, nil
		}
		if t == nil {
			t = time.NewTicker(pollConnected)
			defer t.Stop()
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.run.Quit():
			return nil, ErrClosed
		}
	}
}

// publishOpts turn off nats.go's own retries of "no responders": they run
// on a timer per message, so they reorder messages; the sink retries them
// itself, in order.
var publishOpts = []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}

// send makes one attempt at msg. An error nats.go returns before sending is
// the attempt's outcome as if the server had answered it.
func (s *Sink) send(c *conn, msg *natsgo.Msg) {
	if _, err := c.js.PublishMsgAsync(msg, publishOpts...); err != nil {
		s.failed(c.js, msg, err)
	}
}

// acked is the ack handler of every attempt.
func (s *Sink) acked(_ jetstream.JetStream, msg *natsgo.Msg, ack *jetstream.PubAck) {
	s.mu.Lock()
	s.backoff.Reset()
	p := s.take(msg)
	if s.lost == 0 {
		s.failing.Store(false)
	}
	s.mu.Unlock()
	if p == nil {
		return
	}
	if ack.Duplicate {
		s.log.Debug("the stream already had this message id; dropped the duplicate",
			zap.String("message_id", p.m.ID), zap.Uint64("stream_seq", ack.Sequence))
	}
	s.finish(p, nil)
}

// failed is the error handler of every attempt.
func (s *Sink) failed(_ jetstream.JetStream, msg *natsgo.Msg, err error) {
	if permanent(err) {
		s.mu.Lock()
		p := s.take(msg)
		s.mu.Unlock()
		if p != nil {
			s.finish(p, publishError(msg.Subject, err))
		}
		return
	}
	s.mu.Lock()
	p, ok := s.byMsg[msg]
	if !ok || s.run.Stopped() {
		s.mu.Unlock() // a superseded attempt, or closing: Close reports it
		return
	}
	delete(s.byMsg, msg)
	p.msg = nil
	s.lost++
	// Attempts failing together (one lost connection, one outage) join
	// one scheduled republication; each republication that fails again
	// doubles the pause, and an ack resets it.
	if now := time.Now(); !s.retryAt.After(now) {
		s.retryAt = now.Add(s.backoff.Next())
	}
	s.failing.Store(true)
	s.mu.Unlock()
	s.log.Debug("publish attempt failed; republishing", zap.String("message_id", p.m.ID), zap.Error(err))
	s.wake()
}

// take removes the message of the attempt msg, if the attempt is current.
// s.mu is held.
func (s *Sink) take(msg *natsgo.Msg) *pending {
	p, ok := s.byMsg[msg]
	if !ok {
		return nil
	}
	delete(s.byMsg, msg)
	p.msg = nil
	p.resolved = true
	s.open--
	s.compact()
	return p
}

// compact drops resolved messages from the queue: from its head, which is
// the common case, and all of them when they make up most of it.
func (s *Sink) compact() {
	i := 0
	for i < len(s.queue) && s.queue[i].resolved {
		s.queue[i] = nil
		i++
	}
	s.queue = s.queue[i:]
	if len(s.queue) > 64 && len(s.queue) > 4*s.open {
		q := s.queue[:0]
		for _, p := range s.queue {
			if !p.resolved {
				q = append(q, p)
			}
		}
		clear(s.queue[len(q):])
		s.queue = q
	}
}

func (s *Sink) finish(p *pending, err error) {
	<-s.slots
	p.done(p.m, err)
}

func (s *Sink) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Ready reports whether the connection is up and no message is waiting to
// be republished after a failed attempt. It does not block.
func (s *Sink) Ready() bool {
	c := s.conn.Load()
	return c != nil && !s.run.Stopped() && c.nc.IsConnected() && !s.failing.Load()
}

// Close stops Run, closes the connection and reports every message whose
// outcome is still open with ErrClosed (retryable); one that was sent may
// have been stored, and the relay's republication after a restart is then
// dropped as a duplicate within the stream's duplicate window. Every done
// has been called when Close returns. Publish calls after Close report
// ErrClosed. Close is idempotent and safe for concurrent use.
func (s *Sink) Close() error {
	if !s.run.Stop(&s.mu) {
		return nil
	}
	s.sendMu.Lock() // no send is in progress; later ones see closed
	c := s.conn.Load()
	s.sendMu.Unlock()
	if c != nil {
		c.nc.Close()
	}

	s.mu.Lock()
	var open []*pending
	for _, p := range s.queue {
		if !p.resolved {
			p.resolved = true
			open = append(open, p)
		}
	}
	s.queue, s.open, s.lost = nil, 0, 0
	clear(s.byMsg)
	s.mu.Unlock()
	for _, p := range open {
		s.finish(p, fmt.Errorf("publish to nats subject %q: %w", p.m.Destination, ErrClosed))
	}
	return nil
}
