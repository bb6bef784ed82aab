package app

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/store"
)

// openAPI describes the management API; TestOpenAPIMatchesRoutes checks
// it against apiRoutes.
//
//go:embed openapi.json
var openAPI []byte

// apiRoute is one route of the management API. An action changes a
// pipeline: it needs http.action_token and writes an audit line.
type apiRoute struct {
	method, path string
	action       bool
	handle       func(p *Process, w http.ResponseWriter, r *http.Request) (status int, body any)
}

// apiRoutes are the management API's routes (and GET /status, the
// pipelines as a single relay's /status would show them).
var apiRoutes = []apiRoute{
	{"GET", "/status", false, (*Process).listPipelines},
	{"GET", "/api/v1/openapi.json", false, nil},
	{"GET", "/api/v1/pipelines", false, (*Process).listPipelines},
	{"GET", "/api/v1/pipelines/{name}", false, (*Process).showPipeline},
	{"POST", "/api/v1/pipelines/{name}/pause", true, (*Process).pausePipeline},
	{"POST", "/api/v1/pipelines/{name}/resume", true, (*Process).resumePipeline},
	{"GET", "/api/v1/pipelines/{name}/dead-letters", false, (*Process).listDeadLetters},
	{"GET", "/api/v1/pipelines/{name}/dead-letters/{id}", false, (*Process).showDeadLetter},
	{"POST", "/api/v1/pipelines/{name}/dead-letters/{id}/replay", true, (*Process).replayDeadLetter},
	{"POST", "/api/v1/pipelines/{name}/dead-letters/purge", true, (*Process).purgeDeadLetters},
}

// routes adds the management API to the HTTP endpoint. Reads take
// http.token (open when it is empty), as /status does; actions take
// http.action_token and are answered 403 when it is empty.
func (p *Process) routes(mux *http.ServeMux, protect func(http.Handler) http.Handler) {
	for _, rt := range apiRoutes {
		var h http.Handler
		switch {
		case rt.handle == nil: // the document
			h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(openAPI)
			})
		case rt.action:
			h = p.action(rt)
		default:
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				code, body := rt.handle(p, w, r)
				admin.WriteJSON(w, code, body)
			})
		}
		if !rt.action {
			h = protect(h)
		}
		mux.Handle(rt.method+" "+rt.path, h)
	}
}

// action checks the action token and writes the audit line: who (the
// client's address, and the X-Actor it names, unverified), what (the
// method, route and pipeline), when and the result.
func (p *Process) action(rt apiRoute) http.Handler {
	want := sha256.Sum256([]byte(p.cfg.HTTP.ActionToken))
	audit := p.log.Named("audit")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		code, body := http.StatusForbidden, any(apiError("actions are off: set http.action_token (or http.action_token_file) to enable them"))
		if p.cfg.HTTP.ActionToken != "" {
			scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			got := sha256.Sum256([]byte(strings.TrimSpace(token)))
			if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="outboxrelay actions"`)
				code, body = http.StatusUnauthorized, apiError("unauthorized: send Authorization: Bearer <http.action_token>")
			} else {
				code, body = rt.handle(p, w, r)
			}
		}
		result := "ok"
		if e, isErr := body.(map[string]string); isErr && code >= 300 {
			result = e["error"]
		}
		audit.Info("audit",
			zap.String("who", r.RemoteAddr), zap.String("actor", r.Header.Get("X-Actor")),
			zap.String("what", rt.method+" "+rt.path), zap.String("pipeline", r.PathValue("name")),
			zap.Time("when", at), zap.Int("status", code), zap.String("result", result),
			zap.Duration("took", time.Since(at)))
		admin.WriteJSON(w, code, body)
	})
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

// deadLetters is the named pipeline's dead letters, or the answer to give
// when there is no such pipeline or it is not connected.
func (p *Process) deadLetters(r *http.Request) (*unit, *store.DeadLetters, int, any) {
	u := p.unit(r.PathValue("name"))
	if u == nil {
		return nil, nil, http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", r.PathValue("name")))
	}
	s := u.snapshot()
	if s.app == nil || s.app.DeadLetters() == nil {
		return nil, nil, http.StatusServiceUnavailable, apiError(fmt.Sprintf("pipeline %s is %s: its database is not connected", u.Name, s.state))
	}
	return u, s.app.DeadLetters(), 0, nil
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
	n, err := ReplayDeadLetters(ctx, u.Config, dead, store.DeadLetterFilter{ID: id}, nil, p.log.With(zap.String("pipeline", u.Name)).Named("replay"))
	if err != nil {
		return http.StatusBadGateway, map[string]any{"error": redact.Text(err.Error()), "letters": n.Letters, "parked": n.Parked}
	}
	return http.StatusOK, map[string]any{"letters": n.Letters, "parked": n.Parked}
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
