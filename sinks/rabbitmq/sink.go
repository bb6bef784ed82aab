package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/backoff"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	// ErrClosed is reported for messages whose outcome was still open when
	// the sink stopped (Close, or the end of Run); it matches
	// sinks.ErrClosed too. It is retryable.
	ErrClosed = sinks.Closed("rabbitmq sink closed before the broker confirmed the message")
	// ErrNacked is reported when the broker nacked a message. It is retryable.
	ErrNacked = errors.New("rabbitmq nacked the message")
	// ErrUnroutable is wrapped, as a relay.Permanent error, for messages the
	// broker returned because no queue is bound for their routing key.
	ErrUnroutable = errors.New("unroutable")
)

const (
	appID = "outboxrelay"
	// closeTimeout bounds the connection.close handshake.
	closeTimeout = 5 * time.Second
	// maxShortstr is the AMQP limit of exchange names, routing keys,
	// message ids, types and header names.
	maxShortstr = 255
	// tagHeader carries the delivery tag of each publish, so that a
	// basic.return, which has no delivery tag, can be matched to the one
	// publish it is for. The relay sets it last, over any row header of the
	// same name; RabbitMQ ignores x- headers when a headers exchange routes.
	tagHeader = "x-outboxrelay-publish-tag"
	// maxTagDigits is the length of the widest tag, math.MaxUint64 in decimal.
	maxTagDigits = 20
)

var _ relay.Sink = (*Sink)(nil)
var _ relay.Runner = (*Sink)(nil)

// Sink publishes relay messages to a RabbitMQ exchange. Create it with New,
// optionally call Connect, run Run for as long as it relays, and Close it.
// See the package documentation for its guarantees.
type Sink struct {
	cfg   Config
	log   *zap.Logger
	key   template
	dests destinations  // the keys key rendered, with their destinations
	slots chan struct{} // one token per message between Publish and done

	// pubMu serialises publishing on the channel, so that the delivery tag
	// read before a publish is the tag of that publish, and moves of
	// messages between sessions. Taken before mu.
	pubMu sync.Mutex
	// headers is the header table of the publish being written, guarded
	// by pubMu: amqp091 encodes it before the publish returns and keeps no
	// reference, so one table serves every publish.
	headers amqp.Table

	mu       sync.Mutex
	sess     *session      // the session Publish uses; nil while there is none usable
	prepared *session      // opened by Connect, taken over by Run
	carry    []*pending    // unconfirmed messages of dead sessions in publish order
	wake     chan struct{} // closed and replaced whenever sess or its state changes
	stopped  bool          // Run returned: the sink publishes no more

	run *sinks.Lifecycle // stopped by Close under mu

	ready atomic.Bool

	// Counters for logs and tests.
	sessions    atomic.Int64 // channels that went live
	republished atomic.Int64 // messages republished after a reconnect
}

// pending is one message between Publish and its outcome.
type pending struct {
	m           *relay.Message
	done        func(*relay.Message, error)
	key         string
	contentType string
	// frame is the encoded size of the content header frame, checked
	// against the frame size negotiated with the broker.
	frame int

	// Per publish, guarded by Sink.mu and reset when the message is
	// republished on a new channel.
	//
	// returned is set by the basic.return of this publish and reported when
	// its confirmation arrives.
	returned error
	// dc is amqp091's confirmation of this publish: the only source of its
	// ack or nack. The ack flag of the Confirmation that NotifyPublish
	// delivers can be wrong: a multiple ack is passed on as an ack for
	// every tag up to it, also for a tag that was nacked out of order
	// before. NotifyPublish only tells when the outcome is known.
	dc *amqp.DeferredConfirmation
	// confirmed is set when the confirmation arrived before the publish
	// call returned dc; the publisher then reports the outcome.
	confirmed bool
}

// New checks cfg, applies its defaults and returns a Sink. It neither dials
// nor starts goroutines. log may be nil.
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone() // amqp091 writes ServerName into it
	}
	key, err := parseTemplate(cfg.RoutingKey)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq routing_key: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Sink{
		cfg:     cfg,
		log:     log.Named("rabbitmq"),
		key:     key,
		dests:   destinations{exchange: cfg.Exchange},
		slots:   make(chan struct{}, cfg.MaxInFlight),
		headers: make(amqp.Table, 16),
		wake:    make(chan struct{}),
		run:     sinks.NewLifecycle("rabbitmq"),
	}, nil
}

// Connect makes one attempt to connect: it dials, declares or checks the
// exchange and opens a confirm-mode channel, which Run then takes over. It
// lets the caller report a broker that is unreachable at start as a clear
// error (the message names the URL, its password redacted) instead of Run
// retrying in silence. Connect is optional; calling it again, or after Run
// connected, does nothing. Cancelling ctx aborts the attempt.
func (s *Sink) Connect(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.run.Stopped() || s.stopped:
		s.mu.Unlock()
		return ErrClosed
	case s.prepared != nil || s.sess != nil:
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()

	sess, err := s.dial(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if closed := s.run.Stopped() || s.stopped; closed || s.prepared != nil || s.sess != nil {
		s.mu.Unlock()
		_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
		if closed {
			return ErrClosed
		}
		return nil
	}
	s.prepared = sess
	s.mu.Unlock()
	return nil
}

// Run owns the connection: it uses the one Connect made or dials, and
// redials with exponential backoff and jitter whenever the connection or
// channel drops, republishing unconfirmed messages first. It returns nil
// when ctx is done or the sink is closed; messages still unconfirmed then
// are reported failed with ErrClosed. Run may be called once.
func (s *Sink) Run(ctx context.Context) error {
	if err := s.run.Enter(); err != nil {
		return err
	}
	defer s.run.Exit()
	s.mu.Lock()
	again := s.stopped
	s.mu.Unlock()
	if again {
		return errors.New("rabbitmq sink: Run called twice")
	}
	ctx, cancel := s.run.Context(ctx)
	defer cancel()
	defer s.stop()

	bo := backoff.Backoff{Min: s.cfg.ReconnectBackoffMin, Max: s.cfg.ReconnectBackoffMax}
	for {
		sess, closed := s.takePrepared()
		if closed {
			return nil
		}
		if sess == nil {
			var err error
			if sess, err = s.dial(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				d := bo.Next()
				s.log.Warn("cannot connect to rabbitmq, retrying", zap.Error(err), zap.Duration("retry_in", d))
				if !sinks.Sleep(ctx, d) {
					return nil
				}
				continue
			}
		}
		start := time.Now()
		s.serve(ctx, sess)
		if sess.acked || time.Since(start) >= s.cfg.ReconnectBackoffMax {
			bo.Reset()
		}
		if ctx.Err() != nil || !sinks.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
}

// Publish renders the routing key, waits for a free in-flight slot and a
// usable channel, and publishes m with mandatory set. It returns once m is
// handed to the connection, whose writer sends it with the publishes
// written meanwhile (batchConn); done reports the outcome later (see the
// package documentation). Publish blocks while disconnected, while the
// broker blocks the connection and while Config.MaxInFlight messages are
// unconfirmed; if ctx is done first it reports ctx.Err() through done.
// Messages are written in the order of the Publish calls. Safe for
// concurrent use, though order is only defined for sequential calls.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
	p, err := s.prepare(m, done)
	if err != nil {
		done(m, relay.Permanent(err))
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
	for {
		sess, wait, err := s.current()
		if err != nil {
			s.finish(p, err)
			return
		}
		if sess == nil {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				s.finish(p, ctx.Err())
				return
			}
		}
		ok, err := s.publishOn(ctx, sess, p)
		if err != nil {
			s.finish(p, err)
			return
		}
		if ok {
			return
		}
	}
}

// Ready reports whether a confirm-mode channel is open and the broker does
// not block the connection. Safe for concurrent use.
func (s *Sink) Ready() bool { return s.ready.Load() }

// Close stops Run if it runs, closes the connection and reports every
// message whose outcome is still open as failed with ErrClosed (retryable).
// Publish calls after Close report ErrClosed. Close is idempotent and safe
// for concurrent use; it returns once Run has returned.
func (s *Sink) Close() error {
	if !s.run.Stop(&s.mu) { // Run has returned
		return nil
	}
	s.mu.Lock()
	prepared := s.prepared
	s.prepared = nil
	s.changedLocked()
	s.mu.Unlock()
	var err error
	if prepared != nil {
		if e := prepared.conn.CloseDeadline(time.Now().Add(closeTimeout)); e != nil && !errors.Is(e, amqp.ErrClosed) {
			err = fmt.Errorf("close rabbitmq connection: %w", redact.Error(e, s.cfg.URL))
		}
	}
	s.failCarry()
	return err
}

// takePrepared takes the session Connect opened, if any, for Run, and
// reports whether the sink is closed.
func (s *Sink) takePrepared() (*session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.prepared
	s.prepared = nil
	return sess, s.run.Stopped()
}

// stop marks the end of Run and fails what is left.
func (s *Sink) stop() {
	s.mu.Lock()
	s.stopped = true
	s.sess = nil
	s.changedLocked()
	s.mu.Unlock()
	s.failCarry()
}

func (s *Sink) failCarry() {
	s.mu.Lock()
	failed := s.carry
	s.carry = nil
	s.mu.Unlock()
	for _, p := range failed {
		s.finish(p, ErrClosed)
	}
}

// prepare renders the routing key and checks the message, rejecting what
// the broker or the client library could never take; publishing builds
// the publishing from it.
func (s *Sink) prepare(m *relay.Message, done func(*relay.Message, error)) (*pending, error) {
	key, dest := s.dests.render(s.key, m)
	m.Destination = dest
	switch {
	case key == "":
		return nil, fmt.Errorf("routing key for message %s is empty; check the routing_key template %q", m.ID, s.cfg.RoutingKey)
	case len(key) > maxShortstr:
		return nil, fmt.Errorf("routing key for message %s is %d bytes, over the AMQP limit of 255; it starts %.64q", m.ID, len(key), key)
	case len(m.ID) > maxShortstr:
		return nil, fmt.Errorf("message_id is %d bytes, over the AMQP limit of 255", len(m.ID))
	case len(m.EventType) > maxShortstr:
		return nil, fmt.Errorf("event_type of message %s is %d bytes, over the AMQP limit of 255", m.ID, len(m.EventType))
	case len(m.Envelope) > s.cfg.MaxMessageBytes:
		return nil, fmt.Errorf("message %s is %d bytes, over max_message_bytes %d", m.ID, len(m.Envelope), s.cfg.MaxMessageBytes)
	}
	if err := sinks.CheckDestination("rabbitmq routing key", key); err != nil {
		return nil, fmt.Errorf("message %s: %w", m.ID, err)
	}
	// The properties carry row values too.
	for _, p := range [...]struct{ what, v string }{{"message_id (the message-id property)", m.ID}, {"event_type (the type property)", m.EventType}} {
		if err := sinks.CheckUTF8(p.what, p.v); err != nil {
			return nil, fmt.Errorf("message %s: %w", m.ID, err)
		}
	}

	// message_id, event_type and the content type are properties; the AMQP
	// CloudEvents binding carries datacontenttype in content-type too.
	var buf [16]envelope.Header
	hs, _ := sinks.AMQP.Headers(buf[:0], m)
	valid := true
	for _, h := range hs {
		if len(h.Key) > maxShortstr {
			return nil, fmt.Errorf("header name of message %s is %d bytes, over the AMQP limit of 255; it starts %.64q", m.ID, len(h.Key), h.Key)
		}
		if h.Key == "CC" || h.Key == "BCC" {
			// RabbitMQ routes a message again by these headers
			// (sender-selected distribution) and closes the channel
			// when one is not an array, as a row's header never is.
			return nil, fmt.Errorf("message %s has a header named %s, which RabbitMQ takes for extra routing keys; rename the row's header", m.ID, h.Key)
		}
		valid = valid && utf8.ValidString(h.Key) && utf8.ValidString(h.Value)
	}
	if !valid { // sinks.CheckHeaders names the header; it formats a label per header, so only here
		if err := sinks.CheckHeaders(hs); err != nil {
			return nil, fmt.Errorf("message %s: %w", m.ID, err)
		}
	}
	// send writes the tag of each publish; headerFrameSize counts the widest.
	contentType := sinks.ContentType(m)
	frame := headerFrameSize(hs, m, contentType)
	return &pending{m: m, done: done, key: key, contentType: contentType, frame: frame}, nil
}

// publishing builds the publishing of p, sent with the delivery tag tag,
// in s.headers. s.pubMu must be held until amqp091 has written it.
func (s *Sink) publishing(p *pending, tag uint64) amqp.Publishing {
	m := p.m
	clear(s.headers)
	var buf [16]envelope.Header
	hs, _ := sinks.AMQP.Headers(buf[:0], m) // as prepare checked them
	for _, h := range hs {
		s.headers[h.Key] = h.Value
	}
	s.headers[tagHeader] = strconv.FormatUint(tag, 10)
	pub := amqp.Publishing{
		Headers:      s.headers,
		ContentType:  p.contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Type:         m.EventType,
		AppId:        appID,
		Body:         m.Envelope,
	}
	if !m.CommitTime.IsZero() {
		pub.Timestamp = m.CommitTime.UTC().Truncate(time.Second)
		if !m.Timestamp.IsZero() {
			pub.Timestamp = m.Timestamp.UTC().Truncate(time.Second)
		}
	}
	return pub
}

// headerFrameSize is the size of the content header frame amqp091 writes
// for m with the headers hs and the tag header at its widest: frame header
// and end (8), class, weight, body size and flags (14), then the
// properties that are set.
func headerFrameSize(hs []envelope.Header, m *relay.Message, contentType string) int {
	n := 8 + 14
	n += 1 + len(contentType)
	n += 4
	for _, h := range hs {
		n += 1 + len(h.Key) + 1 + 4 + len(h.Value)
	}
	n += 1 + len(tagHeader) + 1 + 4 + maxTagDigits
	n += 1 // delivery mode
	n += 1 + len(m.ID)
	n += 8 // timestamp
	n += 1 + len(m.EventType)
	n += 1 + len(appID)
	return n
}

// current returns the session to publish on, or a channel that is closed
// when that may have changed.
func (s *Sink) current() (*session, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.run.Stopped() || s.stopped:
		return nil, nil, ErrClosed
	case s.sess != nil && !s.sess.blocked:
		return s.sess, nil, nil
	default:
		return nil, s.wake, nil
	}
}

// publishOn publishes p on sess. It reports false with a nil error when
// sess can no longer be used and p must wait for the next session.
func (s *Sink) publishOn(ctx context.Context, sess *session, p *pending) (bool, error) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()

	if max := sess.conn.Config.FrameSize; max > 0 && p.frame > max {
		return false, relay.Permanent(fmt.Errorf("headers of message %s need a %d byte frame, over the frame size %d negotiated with the broker", p.m.ID, p.frame, max))
	}

	s.mu.Lock()
	usable := s.sess == sess && !sess.dead && !sess.blocked
	s.mu.Unlock()
	if !usable {
		return false, nil
	}
	err := s.send(ctx, sess, p)
	if err == nil {
		return true, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	// Any write error shuts the amqp091 connection down, and the channel may
	// have been closed by the broker: wait for the next session.
	s.log.Debug("publish failed, waiting for a new channel", zap.String("message_id", p.m.ID), zap.Error(redact.Error(err, s.cfg.URL)))
	s.markDead(sess)
	return false, nil
}

// send publishes p on sess with mandatory set and records it as in flight
// under its delivery tag. s.pubMu must be held, so that the tag read before
// the publish is the tag of that publish.
func (s *Sink) send(ctx context.Context, sess *session, p *pending) error {
	s.mu.Lock()
	tag := sess.ch.GetNextPublishSeqNo()
	p.returned, p.dc, p.confirmed = nil, nil, false
	// Registered before the write: the confirmation may be processed before
	// the write returns.
	sess.inflight[tag] = p
	s.mu.Unlock()

	dc, err := sess.ch.PublishWithDeferredConfirmWithContext(ctx, s.cfg.Exchange, p.key, true, false, s.publishing(p, tag))
	if err != nil {
		s.mu.Lock()
		delete(sess.inflight, tag)
		s.mu.Unlock()
		return err
	}
	if dc == nil || dc.DeliveryTag != tag {
		// Cannot happen while pubMu serialises publishing; if it does,
		// confirmations would be matched to the wrong messages. Drop the
		// channel so that everything unconfirmed is republished; without
		// dc, p is never reported delivered.
		s.log.Error("rabbitmq delivery tag mismatch, reconnecting", zap.Uint64("expected", tag))
		s.markDead(sess)
		_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
		dc = nil
	}
	s.mu.Lock()
	p.dc = dc
	confirmed := p.confirmed
	s.mu.Unlock()
	if confirmed {
		s.report(p)
	}
	return nil
}

// finish releases p's slot and reports its outcome.
func (s *Sink) finish(p *pending, err error) {
	<-s.slots
	p.done(p.m, err)
}

// changedLocked recomputes readiness and wakes waiting publishers.
// s.mu must be held.
func (s *Sink) changedLocked() {
	s.ready.Store(!s.run.Stopped() && !s.stopped && s.sess != nil && !s.sess.blocked)
	close(s.wake)
	s.wake = make(chan struct{})
}

// markDead stops new publishes on sess.
func (s *Sink) markDead(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.dead = true
	if s.sess == sess {
		s.sess = nil
	}
	s.changedLocked()
}

// activate republishes the messages carried over from dead sessions on sess,
// in order, and then makes sess the one Publish uses.
func (s *Sink) activate(ctx context.Context, sess *session) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()

	s.mu.Lock()
	carry := s.carry
	s.carry = nil
	s.mu.Unlock()

	if len(carry) > 0 {
		s.log.Info("republishing unconfirmed messages on the new channel", zap.Int("count", len(carry)))
	}
	for i, p := range carry {
		if max := sess.conn.Config.FrameSize; max > 0 && p.frame > max {
			// The broker lowered its frame_max since this was published.
			s.finish(p, relay.Permanent(fmt.Errorf("headers of message %s need a %d byte frame, over the frame size %d negotiated with the broker", p.m.ID, p.frame, max)))
			continue
		}
		if err := s.send(ctx, sess, p); err != nil {
			s.mu.Lock()
			s.carry = carry[i:] // nothing else adds to carry while sess lives
			s.mu.Unlock()
			return err
		}
		s.republished.Add(1)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run.Stopped() || s.stopped || sess.dead {
		return ErrClosed
	}
	s.sess = sess
	s.changedLocked()
	s.sessions.Add(1)
	return nil
}

// teardown closes sess's connection and carries its unconfirmed messages
// over to the next session. Returned messages are reported instead: the
// return already settles that they were not routed.
func (s *Sink) teardown(sess *session) {
	// Close first: a Publish blocked writing to the socket holds pubMu.
	_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
	s.drainReturns(sess)

	s.pubMu.Lock()
	s.mu.Lock()
	sess.dead = true
	if s.sess == sess {
		s.sess = nil
	}
	tags := make([]uint64, 0, len(sess.inflight))
	for t := range sess.inflight {
		tags = append(tags, t)
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })
	var failed []*pending
	keep := make([]*pending, 0, len(tags)+len(s.carry))
	for _, t := range tags {
		p := sess.inflight[t]
		if p.returned != nil {
			failed = append(failed, p)
		} else {
			keep = append(keep, p)
		}
	}
	// Messages carried but never republished on sess come after all that
	// were.
	s.carry = append(keep, s.carry...)
	clear(sess.inflight)
	s.changedLocked()
	s.mu.Unlock()
	s.pubMu.Unlock()

	for _, p := range failed {
		s.finish(p, p.returned)
	}
}

// serve runs one session: it republishes the carried messages, then
// settles confirmations and returns until the channel is gone.
func (s *Sink) serve(ctx context.Context, sess *session) {
	if err := s.activate(ctx, sess); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("rabbitmq channel failed while republishing", zap.Error(redact.Error(err, s.cfg.URL)))
		}
		s.markDead(sess)
		_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
	} else {
		s.log.Info("rabbitmq channel open", zap.String("url", redact.URL(s.cfg.URL)), zap.String("exchange", s.cfg.Exchange))
	}

	done := ctx.Done()
	for {
		select {
		case c, ok := <-sess.confirms:
			// amqp091 passes a multiple ack on as one confirmation per tag:
			// settle those queued behind c too before selecting again.
			for more := ok; more; {
				// RabbitMQ sends basic.return before the confirmation of the
				// same publish and amqp091 delivers both from one goroutine
				// in that order, so the return is queued by now.
				s.drainReturns(sess)
				s.settle(sess, c)
				select {
				case c, ok = <-sess.confirms:
					more = ok
				default:
					more = false
				}
			}
			if !ok {
				s.teardown(sess)
				return
			}
		case r, ok := <-sess.returns:
			if !ok {
				sess.returns = nil
				continue
			}
			s.markReturned(sess, r)
		case b, ok := <-sess.blocks:
			if !ok {
				sess.blocks = nil
				continue
			}
			s.setBlocked(sess, b)
		case e, ok := <-sess.chClosed:
			if !ok {
				sess.chClosed = nil
				continue
			}
			if !sess.conn.IsClosed() { // else the connection loss is logged
				s.log.Warn("rabbitmq channel closed by the broker, reconnecting", zap.Error(redact.Error(e, s.cfg.URL)))
			}
			s.markDead(sess)
			// The connection may survive a channel error; drop it too so
			// that the next session starts clean.
			_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
		case e, ok := <-sess.connClosed:
			if !ok {
				sess.connClosed = nil
				continue
			}
			s.log.Warn("rabbitmq connection lost, reconnecting", zap.Error(redact.Error(e, s.cfg.URL)))
			s.markDead(sess)
		case <-done:
			done = nil
			s.markDead(sess)
			// Acks that arrive before close-ok are still settled: the loop
			// reads the confirmations until the library closes the channel.
			_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
		}
	}
}

func (s *Sink) drainReturns(sess *session) {
	for {
		select {
		case r, ok := <-sess.returns:
			if !ok {
				sess.returns = nil
				return
			}
			s.markReturned(sess, r)
		default:
			return
		}
	}
}

// markReturned records a basic.return on the publish it is for, found by
// the delivery tag the sink put in its tagHeader. Message ids can repeat
// among the messages in flight (two outbox tables, ids chosen by the
// application), so they cannot tell which publish was returned.
func (s *Sink) markReturned(sess *session, r amqp.Return) {
	err := relay.Permanent(fmt.Errorf("%w: exchange %q routing key %q: %s", ErrUnroutable, r.Exchange, r.RoutingKey, r.ReplyText))
	v, _ := r.Headers[tagHeader].(string)
	tag, perr := strconv.ParseUint(v, 10, 64)
	s.mu.Lock()
	defer s.mu.Unlock()
	p := sess.inflight[tag]
	if perr != nil || p == nil || p.returned != nil {
		s.log.Warn("rabbitmq returned a message that is not in flight", zap.String("message_id", r.MessageId), zap.String("tag", v))
		return
	}
	p.returned = err
}

// settle reports the outcome of the publish a confirmation is for. The
// confirmation's ack flag is not used: see pending.dc.
func (s *Sink) settle(sess *session, c amqp.Confirmation) {
	s.mu.Lock()
	p, ok := sess.inflight[c.DeliveryTag]
	delete(sess.inflight, c.DeliveryTag)
	sess.acked = true
	early := ok && p.dc == nil
	var (
		returned error
		dc       *amqp.DeferredConfirmation
	)
	if early {
		p.confirmed = true
	} else if ok {
		returned, dc = p.returned, p.dc
	}
	s.mu.Unlock()
	switch {
	case !ok:
		s.log.Debug("confirmation for an unknown delivery tag", zap.Uint64("tag", c.DeliveryTag))
	case !early:
		s.outcome(p, returned, dc)
	}
}

// report finishes p, whose confirmation arrived; see outcome.
func (s *Sink) report(p *pending) {
	s.mu.Lock()
	err, dc := p.returned, p.dc
	s.mu.Unlock()
	s.outcome(p, err, dc)
}

// outcome finishes p, whose confirmation arrived: returned (the return's
// error), acked by its deferred confirmation dc, or else nacked. amqp091
// settles the deferred confirmation before it notifies NotifyPublish, so
// it is done by now; if it ever is not, p is reported nacked (retried),
// never delivered.
func (s *Sink) outcome(p *pending, returned error, dc *amqp.DeferredConfirmation) {
	err := returned
	if err == nil && !acked(dc) {
		err = fmt.Errorf("%w: exchange %q routing key %q", ErrNacked, s.cfg.Exchange, p.key)
	}
	s.finish(p, err)
}

// acked reports whether dc is settled with a basic.ack.
func acked(dc *amqp.DeferredConfirmation) bool {
	if dc == nil {
		return false
	}
	select {
	case <-dc.Done():
		return dc.Acked()
	default:
		return false
	}
}

func (s *Sink) setBlocked(sess *session, b amqp.Blocking) {
	if b.Active {
		s.log.Warn("rabbitmq blocked the connection, publishing paused", zap.String("reason", b.Reason))
	} else {
		s.log.Info("rabbitmq unblocked the connection")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.blocked = b.Active
	s.changedLocked()
}
