package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

const testSecret = "whsec_c2VjcmV0LWtleS1mb3Itb3V0Ym94cmVsYXk="

// receiver is an HTTP server on loopback TCP that accepts every POST,
// checks its signature and hands it to the consumer of its aggregate type
// (the last path segment).
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	by  map[string]chan sinktest.Received
	bad chan string // signature failures
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{by: map[string]chan sinktest.Received{}, bad: make(chan string, 100)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := checkSignature(req.Header, body); err != nil {
		r.bad <- err.Error()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rec := sinktest.Received{
		ID: req.Header.Get(HeaderWebhookID), Key: req.Header.Get("aggregate_id"),
		Headers: map[string]string{}, Body: body,
	}
	for k, vs := range req.Header {
		for _, v := range vs {
			rec.All = append(rec.All, envelope.Header{Key: strings.ToLower(k), Value: v}) // HTTP names are case-insensitive; the server canonicalizes them
		}
		rec.Headers[strings.ToLower(k)] = vs[0]
	}
	rec.ID = req.Header.Get("message_id")
	at := req.URL.Path[strings.LastIndexByte(req.URL.Path, '/')+1:]
	r.mu.Lock()
	ch := r.by[at]
	r.mu.Unlock()
	if ch != nil {
		ch <- rec
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkSignature checks the Standard Webhooks headers with testSecret,
// written from the specification and not with the sink's code.
func checkSignature(h http.Header, body []byte) error {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", h.Get("webhook-id"), h.Get("webhook-timestamp"), body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	if h.Get("webhook-signature") != want {
		return fmt.Errorf("signature %q, want %q", h.Get("webhook-signature"), want)
	}
	return nil
}

type factory struct{ r *receiver }

func (f factory) NewSink(t *testing.T) relay.Sink {
	s := newSink(t, Config{URL: f.r.srv.URL + "/hooks/{aggregate_type}"})
	if err := s.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	sinktest.RunSink(t, s)
	return s
}

type consumer chan sinktest.Received

func (c consumer) Next(ctx context.Context) (sinktest.Received, error) {
	select {
	case r := <-c:
		return r, nil
	case <-ctx.Done():
		return sinktest.Received{}, ctx.Err()
	}
}

func (f factory) Subscribe(t *testing.T, at string) sinktest.Consumer {
	ch := make(chan sinktest.Received, 10_000)
	f.r.mu.Lock()
	f.r.by[at] = ch
	f.r.mu.Unlock()
	return consumer(ch)
}

func newSink(t testing.TB, cfg Config) *Sink {
	if cfg.Secret == "" {
		cfg.Secret = testSecret
	}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSuite(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	r := newReceiver(t)
	sinktest.Run(t, factory{r})
	close(r.bad)
	for e := range r.bad {
		t.Errorf("receiver: %s", e)
	}
}

// publishOne publishes m through a running s and returns its outcome.
func publishOne(t *testing.T, s *Sink, m *relay.Message) error {
	t.Helper()
	rec := sinktest.NewRecorder()
	s.Publish(context.Background(), m, rec.Done)
	return rec.Wait(t, 1, time.Minute)[m]
}

func message(id string) *relay.Message {
	return &relay.Message{ID: id, AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Envelope: []byte(`{"message_id":"` + id + `"}`)}
}

// TestOutcomes: what each answer of the receiver makes of a message.
func TestOutcomes(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	long := strings.Repeat("x", 600)
	var other *httptest.Server
	mux := http.NewServeMux()
	for _, code := range []int{200, 201, 204, 400, 401, 404, 408, 409, 410, 422, 429, 500, 502, 503, 504} {
		mux.HandleFunc(fmt.Sprintf("/status/%d", code), func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			fmt.Fprintf(w, "answer %d %s", code, long)
		})
	}
	mux.HandleFunc("/redirect/{code}/{where}", func(w http.ResponseWriter, r *http.Request) {
		target := "/status/204"
		if r.PathValue("where") == "other" {
			target = other.URL + "/status/204"
		}
		var code int
		fmt.Sscan(r.PathValue("code"), &code)
		http.Redirect(w, r, target, code)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	other = httptest.NewServer(mux)
	defer other.Close()

	for _, c := range []struct {
		path      string
		follow    bool
		want      string // "" delivered, "retry", "permanent"
		errPieces []string
	}{
		{"/status/200", false, "", nil},
		{"/status/201", false, "", nil},
		{"/status/204", false, "", nil},
		{"/status/400", false, "permanent", []string{"400 Bad Request", "answer 400 x"}},
		{"/status/401", false, "permanent", []string{"401"}},
		{"/status/404", false, "permanent", []string{"404"}},
		{"/status/409", false, "permanent", []string{"409"}},
		{"/status/410", false, "permanent", []string{"410"}},
		{"/status/422", false, "permanent", []string{"422 Unprocessable Entity", `"answer 422 ` + long[:512-len("answer 422 ")] + `"`}},
		{"/status/408", false, "retry", []string{"408"}},
		{"/status/429", false, "retry", []string{"429"}},
		{"/status/500", false, "retry", []string{"500"}},
		{"/status/502", false, "retry", []string{"502"}},
		{"/status/503", false, "retry", []string{"503"}},
		{"/status/504", false, "retry", []string{"504"}},
		{"/redirect/307/same", false, "permanent", []string{"307", "follow_redirects"}},
		{"/redirect/302/same", false, "permanent", []string{"302"}},
		{"/redirect/307/same", true, "", nil},
		{"/redirect/308/same", true, "", nil},
		{"/redirect/302/same", true, "permanent", []string{"302"}}, // would turn the POST into a GET
		{"/redirect/307/other", true, "permanent", []string{"307", other.URL}},
	} {
		t.Run(strings.ReplaceAll(c.path, "/", "_")+fmt.Sprint(c.follow), func(t *testing.T) {
			s := newSink(t, Config{URL: srv.URL + c.path, FollowRedirects: c.follow})
			sinktest.RunSink(t, s)
			err := publishOne(t, s, message("m1"))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("err %v, want delivered", err)
			case c.want == "retry" && (err == nil || !relay.Retryable(err)):
				t.Fatalf("err %v, want a retryable error", err)
			case c.want == "permanent" && (err == nil || relay.Retryable(err)):
				t.Fatalf("err %v, want a permanent error", err)
			}
			for _, p := range c.errPieces {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error does not hold %q: %v", p, err)
				}
			}
			if err != nil && strings.Contains(err.Error(), long[:513]) {
				t.Errorf("error quotes more than 512 bytes of the answer: %d bytes", len(err.Error()))
			}
		})
	}
}

// TestRetryAfter: a 429 with Retry-After holds every request until then.
func TestRetryAfter(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	var mu sync.Mutex
	var times []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		n := len(times)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	s := newSink(t, Config{URL: srv.URL})
	sinktest.RunSink(t, s)
	err := publishOne(t, s, message("m1"))
	if err == nil || !relay.Retryable(err) || !strings.Contains(err.Error(), "Retry-After 2s") {
		t.Fatalf("first answer: err %v, want retryable with Retry-After 2s", err)
	}
	other := message("m2")
	other.AggregateID = "43"
	if err := publishOne(t, s, other); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) != 2 {
		t.Fatalf("%d requests, want 2", len(times))
	}
	if gap := times[1].Sub(times[0]); gap < 1900*time.Millisecond {
		t.Errorf("the request after Retry-After: 2 came %v after the 429, want at least 2s", gap)
	}
}

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"3", 3 * time.Second, true},
		{"0", 0, true},
		{"Wed, 02 Dec 2026 08:00:10 GMT", 10 * time.Second, true},
		{"Wed, 02 Dec 2026 07:59:00 GMT", 0, true},
		{"", 0, false},
		{"-1", 0, false},
		{"soon", 0, false},
	} {
		got, ok := retryAfter(c.v, now)
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

// TestTimeout: a receiver that does not answer within timeout is a
// retryable failure, and the sink is not ready.
func TestTimeout(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			<-release
		}
	}))
	defer srv.Close()
	defer close(release)
	s := newSink(t, Config{URL: srv.URL, Timeout: 300 * time.Millisecond})
	if err := s.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	sinktest.RunSink(t, s)
	err := publishOne(t, s, message("m1"))
	if err == nil || !relay.Retryable(err) {
		t.Fatalf("err %v, want a retryable timeout", err)
	}
	if s.Ready() {
		t.Error("Ready after a timeout")
	}
}

// TestRetryFailsAggregateBehind: after a retryable failure, the messages of
// the aggregate queued behind it fail too instead of overtaking it.
func TestRetryFailsAggregateBehind(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("webhook-id")
		mu.Lock()
		got = append(got, id)
		mu.Unlock()
		if id == "m1" {
			time.Sleep(100 * time.Millisecond) // m2 and m3 queue behind it
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	s := newSink(t, Config{URL: srv.URL})
	sinktest.RunSink(t, s)
	rec := sinktest.NewRecorder()
	msgs := []*relay.Message{message("m1"), message("m2"), message("m3")}
	for _, m := range msgs {
		s.Publish(context.Background(), m, rec.Done)
	}
	errs := rec.Wait(t, 3, time.Minute)
	for _, m := range msgs {
		if err := errs[m]; err == nil || !relay.Retryable(err) {
			t.Errorf("%s: err %v, want retryable", m.ID, err)
		}
	}
	if !strings.Contains(errs[msgs[1]].Error(), "not sent: message m1") {
		t.Errorf("m2: %v, want it to name m1", errs[msgs[1]])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Errorf("the receiver got %v, want only m1", got)
	}
}

// TestRefusedHeaders: a row header HTTP cannot carry, or one the sink
// owns, is a permanent failure naming it; nothing is sent.
func TestRefusedHeaders(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { mu.Lock(); n++; mu.Unlock() }))
	defer srv.Close()
	s := newSink(t, Config{URL: srv.URL})
	sinktest.RunSink(t, s)
	for _, h := range []envelope.Header{
		{Key: "Authorization", Value: "Bearer stolen"},
		{Key: "webhook-signature", Value: "v1,forged"},
		{Key: "Host", Value: "evil.example"},
		{Key: "Content-Length", Value: "1"},
		{Key: "x-bad name", Value: "v"},
		{Key: "x-newline", Value: "a\r\nInjected: 1"},
		{Key: "x-latin1", Value: "\xe9t\xe9"},
	} {
		m := message("m-" + h.Key)
		m.Headers = []envelope.Header{h}
		err := publishOne(t, s, m)
		if err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), fmt.Sprintf("%q", h.Key)) {
			t.Errorf("header %q: err %v, want a permanent error naming it", h.Key, err)
		}
	}
	m := message("m-ok")
	m.Headers = []envelope.Header{{Key: "x-tenant", Value: "acme ✓"}}
	if err := publishOne(t, s, m); err != nil {
		t.Errorf("a valid UTF-8 header: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 1 {
		t.Errorf("%d requests, want 1 (only the valid message)", n)
	}
}

// TestAuth: basic auth and a bearer token reach the receiver.
func TestAuth(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			auth = append(auth, r.Header.Get("Authorization"))
			mu.Unlock()
		}
	}))
	defer srv.Close()
	for _, cfg := range []Config{
		{URL: srv.URL, Username: "relay", Password: "s3cret"},
		{URL: srv.URL, BearerToken: "tok3n"},
	} {
		s := newSink(t, cfg)
		sinktest.RunSink(t, s)
		if err := publishOne(t, s, message("m1")); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"Basic " + base64.StdEncoding.EncodeToString([]byte("relay:s3cret")), "Bearer tok3n"}
	if fmt.Sprint(auth) != fmt.Sprint(want) {
		t.Errorf("Authorization %q, want %q", auth, want)
	}
}

// TestConnectUnreachable: an unreachable receiver at start is one error
// naming the setting, without the URL's password.
func TestConnectUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := newSink(t, Config{URL: "http://relay:hunter2@" + addr + "/hooks/{aggregate_type}"})
	sinktest.CheckUnreachable(t, s, "hunter2", "sink.webhook.url", "cannot reach the webhook receiver at http://"+addr+"/")
}

func TestVerifyRefused(t *testing.T) {
	_, _, err := (&Config{URL: "https://hooks.example.com/"}).VerifyReader(sinks.VerifyOptions{})
	if err == nil || !strings.Contains(err.Error(), "cannot be read back") {
		t.Fatalf("VerifyReader: %v, want a refusal", err)
	}
}

func TestClosedPublish(t *testing.T) {
	s := newSink(t, Config{URL: "http://127.0.0.1:1/"})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	err := publishOne(t, s, message("m1"))
	if !errors.Is(err, sinks.ErrClosed) || !relay.Retryable(err) {
		t.Fatalf("Publish after Close: %v, want retryable ErrClosed", err)
	}
}

// TestRepublishFromDone: a message published again from its own done
// callback, after a retryable failure, is sent again rather than failed as
// one queued behind itself.
func TestRepublishFromDone(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	s := newSink(t, Config{URL: srv.URL})
	sinktest.RunSink(t, s)
	m := message("m1")
	outcomes := make(chan error, 10)
	var done func(*relay.Message, error)
	calls := 0
	done = func(m *relay.Message, err error) {
		outcomes <- err
		if calls++; err != nil && calls < 3 {
			s.Publish(context.Background(), m, done) // from done itself: the chain must be settled already
		}
	}
	s.Publish(context.Background(), m, done)
	if err := <-outcomes; err == nil || !relay.Retryable(err) {
		t.Fatalf("first attempt: %v, want the retryable 502", err)
	}
	select {
	case err := <-outcomes:
		if err != nil {
			t.Fatalf("second attempt: %v, want delivered", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no outcome for the second attempt")
	}
}
