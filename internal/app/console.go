package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/console"
)

// The lag history the console's chart draws: every pipeline sampled every
// HistoryInterval, the last HistorySpan kept.
var (
	HistoryInterval = 5 * time.Second
	HistorySpan     = time.Hour
)

// sampleHistory records every pipeline's figures into p.history every
// HistoryInterval until ctx ends.
func (p *Process) sampleHistory(ctx context.Context) {
	t := time.NewTicker(HistoryInterval)
	defer t.Stop()
	for {
		p.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Process) sampleOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, min(HistoryInterval, 5*time.Second))
	defer cancel()
	now := time.Now()
	for _, st := range p.Statuses(ctx) {
		p.history.Add(st.Name, sampleOf(now, st))
	}
}

// sampleOf is st's figures; those the slot's status does not know are nil.
func sampleOf(at time.Time, st PipelineStatus) console.Sample {
	s := console.Sample{At: at.UTC(), State: st.State}
	slot := st.Slot
	if slot == nil || !slot.Exists {
		return s
	}
	if slot.LagSecondsKnown() {
		v := slot.LagSeconds
		s.LagSeconds = &v
	}
	if slot.LagKnown() {
		v := slot.LagBytes
		s.LagBytes = &v
	}
	if slot.RetainedKnown() {
		v := slot.RetainedWALBytes
		s.RetainedWALBytes = &v
	}
	v := slot.PublishedTotal
	s.PublishedTotal = &v
	return s
}

// historyLength is how many samples make HistorySpan.
func historyLength() int {
	return int(HistorySpan/HistoryInterval) + 1
}

// pipelineHistory is one pipeline's samples in GET /api/v1/history.
type pipelineHistory struct {
	Name    string           `json:"name"`
	Samples []console.Sample `json:"samples"`
}

func (p *Process) showHistory(_ http.ResponseWriter, r *http.Request) (int, any) {
	out := []pipelineHistory{}
	only := r.URL.Query().Get("pipeline")
	for _, u := range p.list() {
		if only == "" || only == u.Name {
			out = append(out, pipelineHistory{u.Name, p.history.Samples(u.Name)})
		}
	}
	if only != "" && len(out) == 0 {
		return http.StatusNotFound, apiError(fmt.Sprintf("no pipeline is named %q", only))
	}
	return http.StatusOK, map[string]any{
		"interval_seconds": HistoryInterval.Seconds(),
		"span_seconds":     HistorySpan.Seconds(),
		"pipelines":        out,
	}
}

// sessionState is the body of the session routes.
type sessionState struct {
	SignedIn bool `json:"signed_in"`
	// Actions: the session may act (signed in with http.action_token).
	Actions   bool       `json:"actions"`
	CSRFToken string     `json:"csrf_token,omitempty"`
	Expires   *time.Time `json:"expires,omitempty"`
	// ActionsEnabled: http.action_token is set; ReadTokenRequired:
	// http.token is, so reads need it or a session.
	ActionsEnabled    bool `json:"actions_enabled"`
	ReadTokenRequired bool `json:"read_token_required"`
}

func (p *Process) sessionState(sess console.Session, ok bool) sessionState {
	st := sessionState{ActionsEnabled: p.cfg.HTTP.ActionToken != "", ReadTokenRequired: p.cfg.HTTP.Token != ""}
	if ok {
		exp := sess.Expires.UTC()
		st.SignedIn, st.Actions, st.CSRFToken, st.Expires = true, sess.Actions, sess.CSRF, &exp
	}
	return st
}

// showSession tells the page whether its browser is signed in and, if it
// is, hands the session's CSRF token again (after a reload of the page).
// Another site's page cannot read this answer: no CORS header allows it.
func (p *Process) showSession(_ http.ResponseWriter, r *http.Request) (int, any) {
	sess, ok := p.sessions.FromRequest(r)
	return http.StatusOK, p.sessionState(sess, ok)
}

// signIn starts a console session for the token in the body
// ({"token": "..."}): http.action_token's may act, http.token's may read.
func (p *Process) signIn(w http.ResponseWriter, r *http.Request) (int, any) {
	var req struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, apiError(`the body must be JSON: {"token": "<http.action_token or http.token>"}`)
	}
	var actions bool
	switch token := strings.TrimSpace(req.Token); {
	case p.cfg.HTTP.ActionToken == "" && p.cfg.HTTP.Token == "":
		return http.StatusBadRequest, apiError("there is nothing to sign in to: reads are open and actions are off (http.action_token is not set)")
	case p.isActionToken(token):
		actions = true
	case sameToken(token, p.cfg.HTTP.Token):
	default:
		return http.StatusUnauthorized, apiError("unauthorized: the token is neither http.action_token nor http.token")
	}
	id, sess := p.sessions.Create(actions)
	http.SetCookie(w, console.Cookie(id, sess, secureRequest(r)))
	return http.StatusOK, p.sessionState(sess, true)
}

// signOut ends the browser's session; with a live session it takes the
// session's CSRF token, so that another site cannot sign an operator out.
func (p *Process) signOut(w http.ResponseWriter, r *http.Request) (int, any) {
	c, err := r.Cookie(console.CookieName)
	if err == nil {
		if sess, ok := p.sessions.Lookup(c.Value); ok {
			if !sess.CheckCSRF(r.Header.Get(console.CSRFHeader)) {
				return http.StatusForbidden, apiError("forbidden: missing or wrong " + console.CSRFHeader + " header")
			}
			p.sessions.Delete(c.Value)
		}
	}
	http.SetCookie(w, console.Cookie("", console.Session{}, secureRequest(r)))
	return http.StatusOK, p.sessionState(console.Session{}, false)
}

// secureRequest reports whether the browser reached the endpoint over
// HTTPS, directly or through a proxy that says so.
func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}
