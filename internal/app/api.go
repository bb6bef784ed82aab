package app

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/console"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/store"
)

// openAPI describes the management API; TestOpenAPIMatchesRoutes checks
// it against apiRoutes.
//
//go:embed openapi.json
var openAPI []byte

// How a route is authorised.
type routeAuth int

const (
	// authRead: http.token as a bearer token (open when it is empty), or
	// a console session.
	authRead routeAuth = iota
	// authAction: http.action_token as a bearer token, or a console
	// session signed in with it that sends its CSRF token; every request
	// writes an audit line.
	authAction
	// authSession: the console's sign-in and sign-out, which check the
	// token themselves and write an audit line.
	authSession
)

// apiRoute is one route of the management API.
type apiRoute struct {
	method, path string
	auth         routeAuth
	handle       func(p *Process, w http.ResponseWriter, r *http.Request) (status int, body any)
}

// apiRoutes are the management API's routes (and GET /status, the
// pipelines as a single relay's /status would show them).
var apiRoutes = []apiRoute{
	{"GET", "/status", authRead, (*Process).listPipelines},
	{"GET", "/api/v1/openapi.json", authRead, nil},
	{"GET", "/api/v1/pipelines", authRead, (*Process).listPipelines},
	{"GET", "/api/v1/pipelines/{name}", authRead, (*Process).showPipeline},
	{"GET", "/api/v1/history", authRead, (*Process).showHistory},
	{"POST", "/api/v1/pipelines/{name}/pause", authAction, (*Process).pausePipeline},
	{"POST", "/api/v1/pipelines/{name}/resume", authAction, (*Process).resumePipeline},
	{"POST", "/api/v1/pipelines/{name}/verify", authAction, (*Process).verifyPipeline},
	{"GET", "/api/v1/pipelines/{name}/dead-letters", authRead, (*Process).listDeadLetters},
	{"GET", "/api/v1/pipelines/{name}/dead-letters/{id}", authRead, (*Process).showDeadLetter},
	{"POST", "/api/v1/pipelines/{name}/dead-letters/{id}/replay", authAction, (*Process).replayDeadLetter},
	{"POST", "/api/v1/pipelines/{name}/dead-letters/{id}/purge", authAction, (*Process).purgeDeadLetter},
	{"POST", "/api/v1/pipelines/{name}/dead-letters/purge", authAction, (*Process).purgeDeadLetters},
	{"GET", "/api/v1/session", authSession, (*Process).showSession},
	{"POST", "/api/v1/session", authSession, (*Process).signIn},
	{"DELETE", "/api/v1/session", authSession, (*Process).signOut},
}

// routes adds the management API and the console to the HTTP endpoint.
// Reads take http.token (open when it is empty), as /status does, or a
// console session; actions take http.action_token, or a session signed in
// with it and its CSRF token, and are answered 403 when it is empty.
func (p *Process) routes(mux *http.ServeMux, protect func(http.Handler) http.Handler) {
	for _, rt := range apiRoutes {
		var h http.Handler
		switch {
		case rt.handle == nil: // the document
			h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(openAPI)
			})
		case rt.auth == authAction:
			h = p.action(rt)
		case rt.auth == authSession:
			h = p.audited(rt)
		default:
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				code, body := rt.handle(p, w, r)
				admin.WriteJSON(w, code, body)
			})
		}
		if rt.auth == authRead {
			h = p.readable(h, protect(h))
		}
		mux.Handle(rt.method+" "+rt.path, h)
	}
	mux.Handle("GET /ui/", p.readable(console.Handler("/ui/"), console.Handler("/ui/")))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
}

// readable serves a request that carries a live console session with
// open, and any other with protected (the bearer token check).
func (p *Process) readable(open, protected http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := p.sessions.FromRequest(r); ok {
			open.ServeHTTP(w, r)
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// action authorises an action and writes its audit line: who (the
// client's address, and the X-Actor it names, unverified), how it was
// authorised, what (the method, route and pipeline), when and the result.
func (p *Process) action(rt apiRoute) http.Handler {
	return p.audited(apiRoute{rt.method, rt.path, rt.auth, func(p *Process, w http.ResponseWriter, r *http.Request) (int, any) {
		if code, body := p.authorize(w, r); code != 0 {
			return code, body
		}
		return rt.handle(p, w, r)
	}})
}

// authorize is 0 when r may act, or the refusal: 403 while actions are
// off; with a bearer token, 401 unless it is http.action_token; with a
// console session, 401 when it is unknown or expired and 403 when it may
// only read or r lacks its CSRF token; 401 with neither.
func (p *Process) authorize(w http.ResponseWriter, r *http.Request) (int, any) {
	if p.cfg.HTTP.ActionToken == "" {
		return http.StatusForbidden, apiError("actions are off: set http.action_token (or http.action_token_file) to enable them")
	}
	if r.Header.Get("Authorization") != "" {
		if !p.isActionToken(bearer(r)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxrelay actions"`)
			return http.StatusUnauthorized, apiError("unauthorized: send Authorization: Bearer <http.action_token>")
		}
		return 0, nil
	}
	if c, err := r.Cookie(console.CookieName); err == nil {
		sess, ok := p.sessions.Lookup(c.Value)
		switch {
		case !ok:
			return http.StatusUnauthorized, apiError("unauthorized: the console session is unknown or expired; sign in again")
		case !sess.Actions:
			return http.StatusForbidden, apiError("forbidden: this console session signed in with http.token, which may only read; sign in with http.action_token to act")
		case !sess.CheckCSRF(r.Header.Get(console.CSRFHeader)):
			return http.StatusForbidden, apiError("forbidden: missing or wrong " + console.CSRFHeader + " header; the console sends the token its sign-in returned")
		}
		return 0, nil
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="outboxrelay actions"`)
	return http.StatusUnauthorized, apiError("unauthorized: send Authorization: Bearer <http.action_token>, or sign in on the console")
}

// bearer is the token of r's Authorization: Bearer header, "" when it
// has another scheme or none.
func bearer(r *http.Request) string {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// isActionToken compares in a time that depends on neither the content
// nor the length of what was sent: both sides are hashed first.
func (p *Process) isActionToken(got string) bool {
	return got != "" && sameToken(got, p.cfg.HTTP.ActionToken)
}

func sameToken(got, want string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return want != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// audited runs rt's handler and writes its audit line.
func (p *Process) audited(rt apiRoute) http.Handler {
	audit := p.log.Named("audit")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		code, body := rt.handle(p, w, r)
		result := "ok"
		if code >= 300 {
			switch e := body.(type) {
			case map[string]string:
				result = e["error"]
			case map[string]any: // an error with counts (replay)
				result = fmt.Sprint(e["error"])
			}
		}
		via := "none"
		switch {
		case r.Header.Get("Authorization") != "":
			via = "bearer"
		case hasCookie(r, console.CookieName):
			via = "session"
		}
		if rt.auth == authSession && r.Method == http.MethodGet {
			// Asking whether the browser is signed in changes nothing.
			admin.WriteJSON(w, code, body)
			return
		}
		audit.Info("audit",
			zap.String("who", r.RemoteAddr), zap.String("actor", r.Header.Get("X-Actor")), zap.String("via", via),
			zap.String("what", rt.method+" "+rt.path), zap.String("query", r.URL.RawQuery), zap.String("pipeline", r.PathValue("name")),
			zap.Time("when", at), zap.Int("status", code), zap.String("result", result),
			zap.Duration("took", time.Since(at)))
		admin.WriteJSON(w, code, body)
	})
}

func hasCookie(r *http.Request, name string) bool {
	_, err := r.Cookie(name)
	return err == nil
}

func apiError(msg string) map[string]string { return map[string]string{"error": msg} }

func (p *Process) listPipelines(_ http.ResponseWriter, r *http.Request) (int, any) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	body := map[string]any{"pipelines": p.Statuses(ctx), "replicas": p.group.Share()}
	if st := p.LastReload(); st != nil {
		body["reload"] = st
	}
	return http.StatusOK, body
}

func (p *Process) showPipeline(_ http.ResponseWriter, r *http.Request) (int, any) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	for _, st := range p.Statuses(ctx) {
		if st.Name == r.PathValue("name") {
			return http.StatusOK, st
		}
	}
	return http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", r.PathValue("name")))
}

// pausePipeline stops the pipeline's reading, waits until what it had in
// flight is acknowledged and its position confirmed (its App returned),
// and answers with the slot's status; the slot is kept.
func (p *Process) pausePipeline(_ http.ResponseWriter, r *http.Request) (int, any) {
	u := p.unit(r.PathValue("name"))
	if u == nil {
		return http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", r.PathValue("name")))
	}
	u.pause(true)
	ctx, cancel := context.WithTimeout(r.Context(), u.Config.Relay.DrainTimeout+30*time.Second)
	defer cancel()
	state, err := u.waitState(ctx, func(s string) bool { return s == StatePaused || s == StateStopped })
	if err != nil {
		return http.StatusAccepted, map[string]string{"state": state, "note": "pausing: still draining; GET the pipeline to see when it is paused"}
	}
	return http.StatusOK, map[string]string{"state": state}
}

// resumePipeline starts a paused pipeline again and waits up to 30s for
// it to stream.
func (p *Process) resumePipeline(_ http.ResponseWriter, r *http.Request) (int, any) {
	u := p.unit(r.PathValue("name"))
	if u == nil {
		return http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", r.PathValue("name")))
	}
	if !u.isPaused() {
		return http.StatusConflict, apiError("pipeline " + u.Name + " is not paused")
	}
	u.pause(false)
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	state, err := u.waitState(ctx, func(s string) bool { return s == StateRunning || s == StateFailed || s == StateStopped })
	if err != nil || state != StateRunning {
		return http.StatusAccepted, map[string]string{"state": state, "note": "resuming; GET the pipeline to follow it"}
	}
	return http.StatusOK, map[string]string{"state": state}
}

// deadLetters is the named pipeline's dead letters, running or not (they
// are in its database), or the answer to give when there is no such
// pipeline or its database URL cannot be used.
func (p *Process) deadLetters(r *http.Request) (*unit, *store.DeadLetters, int, any) {
	u := p.unit(r.PathValue("name"))
	if u == nil {
		return nil, nil, http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", r.PathValue("name")))
	}
	dead, err := u.deadLetterStore(u.snapshot().app)
	if err != nil {
		return nil, nil, http.StatusServiceUnavailable, apiError(fmt.Sprintf("pipeline %s: %s", u.Name, redact.Text(err.Error())))
	}
	return u, dead, 0, nil
}

// letterID is the {id} of the request, or the answer to give.
func letterID(r *http.Request) (int64, int, any) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, http.StatusBadRequest, apiError(fmt.Sprintf("dead letter id %q is not a positive integer", r.PathValue("id")))
	}
	return id, 0, nil
}

// listDeadLetters lists the pipeline's dead letters not replayed yet (all
// of them with ?all=true), each head with the chain parked behind it.
func (p *Process) listDeadLetters(_ http.ResponseWriter, r *http.Request) (int, any) {
	_, dead, code, body := p.deadLetters(r)
	if dead == nil {
		return code, body
	}
	letters, err := dead.List(r.Context(), store.DeadLetterFilter{IncludeReplayed: r.URL.Query().Get("all") == "true"})
	if err != nil {
		return http.StatusServiceUnavailable, apiError(redact.Text(err.Error()))
	}
	if letters == nil {
		letters = []store.DeadLetter{}
	}
	return http.StatusOK, map[string]any{"dead_letters": letters}
}

// showDeadLetter is one dead letter, replayed or not, with its chain.
func (p *Process) showDeadLetter(_ http.ResponseWriter, r *http.Request) (int, any) {
	_, dead, code, body := p.deadLetters(r)
	if dead == nil {
		return code, body
	}
	id, code, body := letterID(r)
	if id == 0 {
		return code, body
	}
	letters, err := dead.List(r.Context(), store.DeadLetterFilter{ID: id, IncludeReplayed: true})
	if err != nil {
		return http.StatusServiceUnavailable, apiError(redact.Text(err.Error()))
	}
	if len(letters) == 0 {
		return http.StatusNotFound, apiError(fmt.Sprintf("no dead letter %d in pipeline %s", id, r.PathValue("name")))
	}
	return http.StatusOK, letters[0]
}

// replayDeadLetter publishes one dead letter, and the chain parked behind
// it, again, as dlq replay --id does.
func (p *Process) replayDeadLetter(_ http.ResponseWriter, r *http.Request) (int, any) {
	u, dead, code, body := p.deadLetters(r)
	if dead == nil {
		return code, body
	}
	id, code, body := letterID(r)
	if id == 0 {
		return code, body
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	var forcedBy string
	if r.URL.Query().Get("force") == "true" {
		// The audit line's who and actor, kept in the letter itself.
		forcedBy = fmt.Sprintf("api: actor %q from %s", r.Header.Get("X-Actor"), r.RemoteAddr)
	}
	n, err := ReplayDeadLetters(ctx, u.Config, dead, store.DeadLetterFilter{ID: id}, forcedBy, nil, p.log.With(zap.String("pipeline", u.Name)).Named("replay"))
	if refused := (*store.RefusedError)(nil); errors.As(err, &refused) {
		return http.StatusUnprocessableEntity, map[string]any{"error": redact.Text(err.Error()), "letters": n.Letters, "parked": n.Parked}
	}
	if err != nil {
		return http.StatusBadGateway, map[string]any{"error": redact.Text(err.Error()), "letters": n.Letters, "parked": n.Parked}
	}
	return http.StatusOK, map[string]any{"letters": n.Letters, "parked": n.Parked, "forced": len(n.Forced) > 0}
}

// purgeDeadLetters deletes the pipeline's dead letters created before
// ?before= (RFC 3339), with the chains parked behind them, as dlq purge.
func (p *Process) purgeDeadLetters(_ http.ResponseWriter, r *http.Request) (int, any) {
	_, dead, code, body := p.deadLetters(r)
	if dead == nil {
		return code, body
	}
	before, err := time.Parse(time.RFC3339, r.URL.Query().Get("before"))
	if err != nil {
		return http.StatusBadRequest, apiError("before must be a time such as 2026-01-02T15:04:05Z: the dead letters created before it are purged")
	}
	n, err := dead.Purge(r.Context(), before)
	if err != nil {
		return http.StatusServiceUnavailable, apiError(redact.Text(err.Error()))
	}
	return http.StatusOK, map[string]any{"letters": n.Letters, "parked": n.Parked}
}

// purgeDeadLetter deletes one dead letter, replayed or not, with the chain
// parked behind it, releasing its aggregate.
func (p *Process) purgeDeadLetter(_ http.ResponseWriter, r *http.Request) (int, any) {
	_, dead, code, body := p.deadLetters(r)
	if dead == nil {
		return code, body
	}
	id, code, body := letterID(r)
	if id == 0 {
		return code, body
	}
	n, err := dead.PurgeID(r.Context(), id)
	if errors.Is(err, store.ErrNoDeadLetter) {
		return http.StatusNotFound, apiError(fmt.Sprintf("no dead letter %d in pipeline %s", id, r.PathValue("name")))
	}
	if err != nil {
		return http.StatusServiceUnavailable, apiError(redact.Text(err.Error()))
	}
	return http.StatusOK, map[string]any{"letters": n.Letters, "parked": n.Parked}
}
