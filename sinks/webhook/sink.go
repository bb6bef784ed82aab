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
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/internal/batch"
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

	q   *batch.Queue     // per-aggregate chains and the workers that send
	run *sinks.Lifecycle // q's

	ready atomic.Bool
	pause atomic.Int64 // Unix nanoseconds before which no request is sent (Retry-After)
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
	}
	s.q = batch.New(batch.Options{
		Name: "webhook", MaxInFlight: cfg.MaxInFlight, Workers: cfg.MaxConnsPerHost,
		MaxBatch: cfg.Batch.MaxMessages, Linger: cfg.Batch.Linger, Send: s.sendBatch, Closed: ErrClosed,
	})
	s.run = s.q.Lifecycle()
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
	s.q.Publish(ctx, m, done)
}

// Run sends the queued messages, over at most Config.MaxConnsPerHost
// requests at once, until ctx is done or the sink is closed, then returns
// nil. Requests in flight when the sink is closed are finished first;
// cancelling ctx abandons them, reporting their messages with ctx's error.
// Messages still queued are reported by Close. Run may be called once.
func (s *Sink) Run(ctx context.Context) error { return s.q.Run(ctx) }

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
	return s.post(ctx, u, h, m.ID, m.Envelope, m.Destination)
}

// post sends body to u, signed as the message id, once the sink's pause
// (Retry-After) is over, and returns the outcome; dest names the
// destination in errors.
func (s *Sink) post(ctx context.Context, u *url.URL, h http.Header, id string, body []byte, dest string) error {
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
	h[HeaderWebhookSignature] = []string{s.signer.sign(id, ts, body)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
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
		return fmt.Errorf("post to webhook %s: %w", dest, scrub(err, u))
	}
	defer drain(resp)
	return s.outcome(dest, resp)
}

// outcome maps the receiver's answer to the message's outcome. This is the
// one place that decides what is retried: 2xx is delivered; 408, 429 and
// 5xx are retryable (and a Retry-After on 429 or 503 pauses the sink);
// everything else, 3xx included, is permanent, with the status and the
// start of the answer's body.
func (s *Sink) outcome(dest string, resp *http.Response) error {
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		s.ready.Store(!s.run.Stopped())
		return nil
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		s.ready.Store(code < 500 && !s.run.Stopped())
		err := fmt.Errorf("webhook %s answered %s%s", dest, resp.Status, excerpt(resp))
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
		return relay.Permanent(fmt.Errorf("webhook %s answered %s%s%s", dest, resp.Status, hint, excerpt(resp)))
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
	if !s.q.Close() {
		return nil
	}
	s.ready.Store(false)
	s.client.CloseIdleConnections()
	return nil
}
