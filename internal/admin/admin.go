// Package admin is the relay's HTTP endpoint for operators and
// orchestrators: /healthz (liveness), /readyz (readiness), /status (the
// slot's status as JSON, store.Status) and /metrics (Prometheus). An optional bearer
// token guards /status and /metrics; the probes stay open.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/store"
)

// Config configures a Server. Every func is called per request, from the
// server's goroutines, and must be safe for concurrent use.
type Config struct {
	// Listen is the TCP address, host:port; port 0 picks a free port.
	Listen string
	// Ready returns nil while the relay can do its work, or the reason it
	// cannot; /readyz answers 200 or 503 with the reason. Nil means always ready.
	Ready func() error
	// Standby reports whether this replica is a healthy standby (the slot
	// is held by another relay, the broker is reachable). /readyz answers
	// 503 for a standby, but /readyz?standby=ok answers 200, for
	// orchestrators that must count a standby as ready. Nil: never.
	Standby func() bool
	// Status reads the slot's status for /status (store.ReadStatus); the request's context
	// is bounded by StatusTimeout (default 5s). Nil disables /status.
	Status        func(ctx context.Context) (store.Status, error)
	StatusTimeout time.Duration
	// ReadyQuery, when set, replaces Ready and Standby: /readyz answers 200
	// when it returns nil for the request's query (a process of many
	// pipelines reads pipeline= and standby=), 503 with the reason otherwise.
	ReadyQuery func(q url.Values) error
	// Routes adds routes to the endpoint's; protect wraps a handler in the
	// bearer token check of /status and /metrics.
	Routes func(mux *http.ServeMux, protect func(http.Handler) http.Handler)
	// Metrics serves /metrics. Nil disables it.
	Metrics http.Handler
	// Token, when set, is the bearer token /status and /metrics require
	// (Authorization: Bearer <token>); without it they answer 401.
	// /healthz and /readyz stay open, so that probes need no secret.
	Token string
	// ShutdownTimeout bounds the wait for open requests when Run stops (default 5s).
	ShutdownTimeout time.Duration
	Log             *zap.Logger
}

// Server is the HTTP endpoint. Listen binds it; Run serves.
type Server struct {
	cfg Config
	log *zap.Logger
	ln  net.Listener
	srv *http.Server
}

// New returns a Server. It neither binds nor starts anything.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.StatusTimeout <= 0 {
		cfg.StatusTimeout = 5 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Log.Named("http")}
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	return s
}

// Listen binds the address and logs it ("http listening", addr), so that
// a busy port fails before the relay starts and port 0 can be found.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("http.listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	s.log.Info("http listening", zap.String("addr", ln.Addr().String()))
	return nil
}

// Addr is the bound address, or nil before Listen.
func (s *Server) Addr() net.Addr {
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Run serves until ctx is cancelled, then shuts down like
// http.Server.Shutdown: it stops accepting, waits up to ShutdownTimeout for
// open requests and returns nil. It calls Listen first if needed. Cancel
// ctx only once the relay has drained, so that /metrics and /readyz answer
// during the drain.
func (s *Server) Run(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(shutCtx)
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	if err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	return nil
}

// Handler returns the endpoint's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		text(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.Status != nil {
		mux.Handle("GET /status", s.protect(http.HandlerFunc(s.status)))
	}
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.protect(s.cfg.Metrics))
	}
	if s.cfg.Routes != nil {
		s.cfg.Routes(mux, s.protect)
	}
	return mux
}

// protect requires the bearer token, when one is configured. The
// comparison takes the same time whatever the token sent: both sides are
// hashed first, so neither the content nor the length leaks through timing.
func (s *Server) protect(h http.Handler) http.Handler {
	if s.cfg.Token == "" {
		return h
	}
	want := sha256.Sum256([]byte(s.cfg.Token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(token)))
		ok := subtle.ConstantTimeCompare(got[:], want[:]) == 1
		if !strings.EqualFold(scheme, "Bearer") || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxrelay"`)
			text(w, http.StatusUnauthorized, "unauthorized: send Authorization: Bearer <http.token>")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.cfg.ReadyQuery != nil {
		if err := s.cfg.ReadyQuery(r.URL.Query()); err != nil {
			text(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
		text(w, http.StatusOK, "ready")
		return
	}
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			if r.URL.Query().Get("standby") == "ok" && s.cfg.Standby != nil && s.cfg.Standby() {
				text(w, http.StatusOK, "standby: "+err.Error())
				return
			}
			text(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	text(w, http.StatusOK, "ready")
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StatusTimeout)
	defer cancel()
	st, err := s.cfg.Status(ctx)
	if err != nil {
		msg := redact.Text(err.Error())
		s.log.Warn("read status", zap.String("error", msg))
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": msg})
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func text(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, body)
}

// WriteJSON answers with v as JSON, never cached.
func WriteJSON(w http.ResponseWriter, code int, v any) { writeJSON(w, code, v) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}
