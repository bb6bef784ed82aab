package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outboxrelay/outboxrelay/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestRoutes(t *testing.T) {
	var notReady atomic.Pointer[string]
	var statusErr error
	s := New(Config{
		Ready: func() error {
			if r := notReady.Load(); r != nil {
				return errors.New(*r)
			}
			return nil
		},
		Status: func(context.Context) (store.Status, error) {
			if statusErr != nil {
				return store.Status{}, statusErr
			}
			return store.Status{Slot: "outboxrelay", Exists: true}, nil
		},
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "outboxrelay_x 1\n") }),
	})
	h := s.Handler()
	if code, body := serve(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := serve(t, h, "/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	reason := "kafka sink is not connected"
	notReady.Store(&reason)
	if code, body := serve(t, h, "/readyz"); code != 503 || body != "not ready: kafka sink is not connected\n" {
		t.Errorf("/readyz not ready = %d %q", code, body)
	}
	if code, _ := serve(t, h, "/healthz"); code != 200 {
		t.Errorf("/healthz while not ready = %d", code)
	}
	if code, body := serve(t, h, "/status"); code != 200 || !strings.HasPrefix(body, `{"slot":"outboxrelay","exists":true,`) {
		t.Errorf("/status = %d %s", code, body)
	}
	statusErr = errors.New("cannot connect to postgres://relay:hunter2@db/shop")
	if code, body := serve(t, h, "/status"); code != 503 || strings.Contains(body, "hunter2") || !strings.Contains(body, `"error"`) {
		t.Errorf("/status failing = %d %s", code, body)
	}
	if code, body := serve(t, h, "/metrics"); code != 200 || body != "outboxrelay_x 1\n" {
		t.Errorf("/metrics = %d %q", code, body)
	}
	if code, _ := serve(t, h, "/nope"); code != 404 {
		t.Errorf("/nope = %d", code)
	}
}

func TestRunLogsAddressAndShutsDown(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := New(Config{Listen: "127.0.0.1:0", Log: zap.New(core)})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr().String()
	entries := logs.FilterMessage("http listening").All()
	if len(entries) != 1 || entries[0].ContextMap()["addr"] != addr {
		t.Fatalf("log entries %v, want http listening with addr %s", entries, addr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz = %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Error("server still answers after Run returned")
	}
}

func TestListenBusy(t *testing.T) {
	a := New(Config{Listen: "127.0.0.1:0"})
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	defer a.ln.Close()
	b := New(Config{Listen: a.Addr().String()})
	if err := b.Listen(); err == nil || !strings.Contains(err.Error(), "http.listen") {
		t.Errorf("Listen on a busy port = %v", err)
	}
}

// TestToken: with a token, /status and /metrics answer 401 unless the
// request carries it as a bearer token; the probes stay open.
func TestToken(t *testing.T) {
	const token = "s3cret-token-0123456789"
	s := New(Config{
		Ready:   func() error { return nil },
		Status:  func(context.Context) (store.Status, error) { return store.Status{Slot: "outboxrelay"}, nil },
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "outboxrelay_x 1\n") }),
		Token:   token,
	})
	h := s.Handler()
	get := func(path, auth string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if rec := get(path, ""); rec.Code != 200 {
			t.Errorf("%s without a token = %d, want 200", path, rec.Code)
		}
	}
	for _, path := range []string{"/status", "/metrics"} {
		for _, auth := range []string{"", "Bearer", "Bearer wrong", "Basic " + token, "Bearer " + token + "x", token} {
			rec := get(path, auth)
			if rec.Code != http.StatusUnauthorized {
				t.Errorf("%s with Authorization %q = %d, want 401", path, auth, rec.Code)
			}
			if rec.Header().Get("WWW-Authenticate") == "" {
				t.Errorf("%s 401 without WWW-Authenticate", path)
			}
			if strings.Contains(rec.Body.String(), token) {
				t.Errorf("%s 401 body shows the token: %q", path, rec.Body.String())
			}
		}
		for _, auth := range []string{"Bearer " + token, "bearer " + token} {
			if rec := get(path, auth); rec.Code != 200 {
				t.Errorf("%s with Authorization %q = %d, want 200", path, auth, rec.Code)
			}
		}
	}
}
