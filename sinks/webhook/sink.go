package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

var (
	_ relay.Sink      = (*Sink)(nil)
	_ relay.Runner    = (*Sink)(nil)
	_ sinks.Connector = (*Sink)(nil)
)

// Headers of the Standard Webhooks specification.
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// ErrClosed is reported for messages whose outcome was still open when the
// sink stopped; it matches sinks.ErrClosed too. It is retryable.
var ErrClosed = sinks.Closed("webhook sink closed before the receiver answered the message")

// responseExcerpt is how much of a refusing answer's body an error quotes.
const responseExcerpt = 512

// Sink POSTs relay messages to a webhook receiver. Create it with New,
// optionally call Connect, run Run for as long as it relays (Publish only
// queues) and Close it. It is safe for concurrent use. See the package
// documentation for its guarantees.
type Sink struct {
	cfg    Config
	log    *zap.Logger
	ep     endpoint
	signer signer
	client *http.Client
	now    func() time.Time

	slots chan struct{} // one per message queued or in flight (MaxInFlight)
	queue chan *item    // aggregates' heads, ready to send

	mu     sync.Mutex            // guards chains; orders Publish against Close
	chains map[aggregate][]*item // an entry per aggregate with a message queued or in flight: the ones behind it

	run   *sinks.Lifecycle // stopped by Close under mu
	ready atomic.Bool
	pause atomic.Int64 // Unix nanoseconds before which no request is sent (Retry-After)
}

type aggregate struct{ typ, id string }

// item is one message between Publish and its outcome.
type item struct {
	m    *relay.Message
	done func(*relay.Message, error)
	key  aggregate
}

// New checks cfg, applies its defaults and returns a Sink. It neither
// connects nor starts goroutines. A nil log means zap.NewNop().
func New(cfg Config, log *zap.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ep, err := parseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink.webhook.url: %w", err) // empty, and url_file is set: New does not read files
	}
	sg, err := parseSecrets(cfg.Secret)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: cfg.Timeout,
		MaxConnsPerHost:     cfg.MaxConnsPerHost,
		MaxIdleConnsPerHost: cfg.MaxConnsPerHost,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	s := &Sink{
		cfg:    cfg,
		log:    log.Named("webhook"),
		ep:     ep,
		signer: sg,
		now:    time.Now,
		slots:  make(chan struct{}, cfg.MaxInFlight),
		queue:  make(chan *item, cfg.MaxInFlight),
		chains: map[aggregate][]*item{},
		run:    sinks.NewLifecycle("webhook"),
	}
	s.client = &http.Client{Transport: tr, Timeout: cfg.Timeout, CheckRedirect: s.checkRedirect}
	return s, nil
}

// checkRedirect follows a redirect only when FollowRedirects is set, the
// answer is 307 or 308 (which keep the method and the body; 301, 302 and
// 303 would turn the POST into a GET without the message) and the target
// has the configured scheme and host. Otherwise the 3xx answer itself is
// the outcome, a permanent failure.
func (s *Sink) checkRedirect(req *http.Request, via []*http.Request) error {
	code := 0
	if req.Response != nil {
		code = req.Response.StatusCode
	}
	if !s.cfg.FollowRedirects || len(via) >= 10 || (code != http.StatusTemporaryRedirect && code != http.StatusPermanentRedirect) ||
		req.URL.Scheme != s.ep.scheme || req.URL.Host != s.ep.host {
		return http.ErrUseLastResponse
	}
	return nil
}

// Connect sends OPTIONS to the receiver's origin (scheme://host/) once, so
// that an unreachable receiver or a failed TLS handshake at start is one
// clear error; any HTTP answer, whatever its status, counts as reachable.
// It is optional. ctx bounds the attempt.
func (s *Sink) Connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodOptions, s.ep.origin, nil)
	if err != nil {
		return fmt.Errorf("probe the webhook receiver: %w", err)
	}
	s.authorize(req)
	resp, err := s.client.Do(req)
	if err != nil {
		s.ready.Store(false)
		err = scrub(redact.Error(err, s.cfg.URL), req.URL)
		if ce := sinks.CertError(err); ce != nil {
			return fmt.Errorf("cannot reach the webhook receiver at %s: its TLS certificate did not verify (%v); check sink.webhook.tls.ca_file and server_name", s.ep.origin, ce)
		}
		return fmt.Errorf("cannot reach the webhook receiver at %s (%v); check sink.webhook.url and that the receiver is running and reachable", s.ep.origin, err)
	}
	drain(resp)
	s.ready.Store(!s.run.Stopped())
	return nil
}

// Publish queues m for Run; done is called exactly once, from one of Run's
// goroutines once the receiver has answered m, or before Publish returns
// when ctx ends or the sink is closed first (ctx.Err() or ErrClosed, both
// retryable). done must not block. Publish blocks while Config.MaxInFlight
// messages are queued or in flight. Messages of one aggregate are sent in
// the order of the Publish calls, each once the one before has been
// answered.
func (s *Sink) Publish(ctx context.Context, m *relay.Message, done func(*relay.Message, error)) {
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
	it := &item{m: m, done: done, key: aggregate{m.AggregateType, m.AggregateID}}
	s.mu.Lock()
	if s.run.Stopped() {
		s.mu.Unlock()
		<-s.slots
		done(m, ErrClosed)
		return
	}
	waiting, busy := s.chains[it.key]
	if busy {
		s.chains[it.key] = append(waiting, it)
	} else {
		s.chains[it.key] = nil
		s.queue <- it // never blocks: the queue has room for every slot
	}
	s.mu.Unlock()
}

// Run sends the queued messages, over at most Config.MaxConnsPerHost
// requests at once, until ctx is done or the sink is closed, then returns
// nil. Requests in flight when the sink is closed are finished first;
// cancelling ctx abandons them, reporting their messages with ctx's error.
// Messages still queued are reported by Close. Run may be called once.
func (s *Sink) Run(ctx context.Context) error {
	if err := s.run.Enter(); err != nil {
		return err
	}
	defer s.run.Exit()
	var g errgroup.Group
	for range s.cfg.MaxConnsPerHost {
		g.Go(func() error {
			for {
				if s.run.Stopped() {
					return nil // the queue may still hold messages: Close reports them
				}
				select {
				case it := <-s.queue:
					if s.run.Stopped() {
						s.queue <- it // never blocks: it holds a slot
						return nil
					}
					s.deliver(ctx, it)
				case <-ctx.Done():
					return nil
				case <-s.run.Quit():
					return nil
				}
			}
		})
	}
	return g.Wait()
}

// deliver sends it, reports its outcome and queues the next message of its
// aggregate, or, after a retryable failure, fails the ones behind it so that
// none overtakes it.
func (s *Sink) deliver(ctx context.Context, it *item) {
	err := s.send(ctx, it.m)

	// The aggregate's chain is settled before done reports it: a message
	// of the aggregate published from done (a caller's own retry) then
	// starts a chain of its own instead of being failed as one behind it.
	var behind []*item
	s.mu.Lock()
	waiting := s.chains[it.key]
	switch {
	case len(waiting) == 0:
		delete(s.chains, it.key)
	case err != nil && relay.Retryable(err):
		behind = waiting
		delete(s.chains, it.key)
	default:
		next := waiting[0]
		waiting[0] = nil
		s.chains[it.key] = waiting[1:]
		s.queue <- next // never blocks: next holds a slot
	}
	s.mu.Unlock()
	it.done(it.m, err)
	<-s.slots
	for _, b := range behind {
		b.done(b.m, fmt.Errorf("not sent: message %s of aggregate %s/%s before it failed: %w", it.m.ID, it.key.typ, it.key.id, err))
		<-s.slots
	}
}

// send POSTs m once and returns its outcome: nil, a retryable error, or a
// relay.Permanent one.
func (s *Sink) send(ctx context.Context, m *relay.Message) error {
	u, err := s.ep.render(m)
	if err != nil {
		m.Destination = s.ep.origin
		return relay.Permanent(err)
	}
	m.Destination = destination(u)
	h, err := s.headers(m)
	if err != nil {
		return relay.Permanent(err)
	}
	if wait := time.Until(time.Unix(0, s.pause.Load())); wait > 0 {
		if !s.run.Sleep(ctx, wait) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return ErrClosed
		}
	}
	ts := s.now().Unix()
	h[HeaderWebhookTimestamp] = []string{strconv.FormatInt(ts, 10)}
	h[HeaderWebhookSignature] = []string{s.signer.sign(m.ID, ts, m.Envelope)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(m.Envelope))
	if err != nil {
		return relay.Permanent(fmt.Errorf("build the webhook request: %w", redact.Error(err, u.String())))
	}
	req.Header = h
	s.authorize(req)
	resp, err := s.client.Do(req)
	if err != nil {
		s.ready.Store(false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("post to webhook %s: %w", m.Destination, scrub(err, u))
	}
	defer drain(resp)
	return s.outcome(m, resp)
}

// outcome maps the receiver's answer to the message's outcome. This is the
// one place that decides what is retried: 2xx is delivered; 408, 429 and
// 5xx are retryable (and a Retry-After on 429 or 503 pauses the sink);
// everything else, 3xx included, is permanent, with the status and the
// start of the answer's body.
func (s *Sink) outcome(m *relay.Message, resp *http.Response) error {
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		s.ready.Store(!s.run.Stopped())
		return nil
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		s.ready.Store(code < 500 && !s.run.Stopped())
		err := fmt.Errorf("webhook %s answered %s%s", m.Destination, resp.Status, excerpt(resp))
		if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
			if d, ok := retryAfter(resp.Header.Get("Retry-After"), s.now()); ok {
				d = min(d, s.cfg.MaxRetryAfter)
				s.holdUntil(s.now().Add(d))
				err = fmt.Errorf("%w (Retry-After %v)", err, d)
			}
		}
		return err
	default:
		s.ready.Store(!s.run.Stopped())
		hint := ""
		if code >= 300 && code < 400 {
			hint = fmt.Sprintf(" to %s; set sink.webhook.url to the final URL (or sink.webhook.follow_redirects for 307 and 308 on the same host)", redact.URL(resp.Header.Get("Location")))
		}
		return relay.Permanent(fmt.Errorf("webhook %s answered %s%s%s", m.Destination, resp.Status, hint, excerpt(resp)))
	}
}

// holdUntil makes every request wait until t, unless a later pause holds
// already.
func (s *Sink) holdUntil(t time.Time) {
	for {
		cur := s.pause.Load()
		if cur >= t.UnixNano() || s.pause.CompareAndSwap(cur, t.UnixNano()) {
			return
		}
	}
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(now)), true
}

// excerpt returns ": " and the first responseExcerpt bytes of resp's body,
// quoted, or "" when it is empty.
func excerpt(resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, responseExcerpt)) // a partial body still helps
	if len(b) == 0 {
		return ""
	}
	return fmt.Sprintf(": %q", b)
}

// drain reads a little of resp's body, so that its connection can be
// reused, and closes it.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// scrub hides the URL's secrets in a transport error.
func scrub(err error, u *url.URL) error {
	err = redact.Error(err, u.String())
	var ue *url.Error
	if errors.As(err, &ue) {
		return redact.Error(ue.Err, "")
	}
	return err
}

// authorize sets the request's Authorization header.
func (s *Sink) authorize(req *http.Request) {
	switch {
	case s.cfg.Username != "":
		req.SetBasicAuth(s.cfg.Username, s.cfg.Password)
	case s.cfg.BearerToken != "":
		req.Header.Set("Authorization", "Bearer "+s.cfg.BearerToken)
	}
}

// headers returns m's request headers but for the timestamp and signature:
// webhook-id, then the relay's headers (sinks.HTTP), names as written. A
// header HTTP cannot carry, or one whose name the sink or HTTP owns, is an
// error: the message is refused rather than sent without it.
func (s *Sink) headers(m *relay.Message) (http.Header, error) {
	var own [16]envelope.Header
	hs, n := sinks.HTTP.Headers(own[:0], m)
	if err := contained(hs, n); err != nil {
		return nil, err
	}
	h := make(http.Header, len(hs)+3)
	h[HeaderWebhookID] = []string{m.ID}
	for _, x := range hs {
		if x.Key == sinks.HeaderContentType {
			h["Content-Type"] = []string{x.Value}
			continue
		}
		h[x.Key] = append(h[x.Key], x.Value)
	}
	return h, nil
}

// Ready reports whether the receiver answered the latest request (or the
// probe of Connect) with anything but a 5xx; false before the first one,
// while requests fail to connect or time out, and after Close. It does
// not block.
func (s *Sink) Ready() bool { return s.ready.Load() }

// Close stops Run (after the requests in flight, if any), reports every
// queued message with ErrClosed (retryable) and closes idle connections.
// Every done has been called when Close returns. Publish calls after Close
// report ErrClosed. Close is idempotent and safe for concurrent use.
func (s *Sink) Close() error {
	if !s.run.Stop(&s.mu) {
		return nil
	}
	s.ready.Store(false)
	s.mu.Lock()
	var left []*item
	for {
		select {
		case it := <-s.queue:
			left = append(left, it)
			continue
		default:
		}
		break
	}
	for _, it := range left {
		left = append(left, s.chains[it.key]...)
	}
	clear(s.chains)
	s.mu.Unlock()
	for _, it := range left {
		it.done(it.m, ErrClosed)
		<-s.slots
	}
	s.client.CloseIdleConnections()
	return nil
}
