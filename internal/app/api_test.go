package app

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/config"
)

// testProcess is a Process of two pipelines that never ran, behind its
// HTTP endpoint.
func testProcess(t *testing.T, http config.HTTP) (*Process, http.Handler, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	cfg := config.Default()
	cfg.HTTP = http
	cfg.Pipelines = []config.Pipeline{{Name: "a"}, {Name: "b"}}
	p, err := NewProcess(cfg, zap.New(core), Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := admin.New(admin.Config{ReadyQuery: p.ready, Routes: p.routes, Token: http.Token})
	return p, srv.Handler(), logs
}

// TestOpenAPIMatchesRoutes: every route the document describes is served,
// and every route served is described, with the same method.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	var documented, served []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	for _, rt := range apiRoutes {
		served = append(served, rt.method+" "+rt.path)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("openapi.json documents\n  %s\nthe handlers serve\n  %s", strings.Join(documented, "\n  "), strings.Join(served, "\n  "))
	}
	// And the mux answers each of them (not 404 or 405 from the mux); the
	// actions answer 401, as no token is sent.
	_, h, _ := testProcess(t, config.HTTP{ActionToken: "act"})
	for _, route := range served {
		method, path, _ := strings.Cut(route, " ")
		path = strings.ReplaceAll(path, "{name}", "a")
		req := httptest.NewRequest(method, path, nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusMethodNotAllowed || rec.Code == http.StatusNotFound && !strings.Contains(rec.Body.String(), "no pipeline") {
			t.Errorf("%s %s: %d %s", method, path, rec.Code, rec.Body)
		}
	}
}

// TestActionsNeedTheActionToken: actions are off without http.action_token,
// refused without it or with the read token, and each one, refused or not,
// writes an audit line.
func TestActionsNeedTheActionToken(t *testing.T) {
	do := func(h http.Handler, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/api/v1/pipelines/a/resume", nil)
		req.RemoteAddr = "192.0.2.7:4000"
		req.Header.Set("X-Actor", "alice")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	_, off, logs := testProcess(t, config.HTTP{Token: "read"})
	if rec := do(off, "Bearer read"); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "actions are off") {
		t.Errorf("without http.action_token: %d %s", rec.Code, rec.Body)
	}
	_, on, logs2 := testProcess(t, config.HTTP{Token: "read", ActionToken: "act"})
	for _, auth := range []string{"", "Bearer read", "Bearer act2", "Basic act"} {
		if rec := do(on, auth); rec.Code != http.StatusUnauthorized {
			t.Errorf("with %q: %d %s", auth, rec.Code, rec.Body)
		}
	}
	if rec := do(on, "Bearer act"); rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "not paused") {
		t.Errorf("with the action token: %d %s", rec.Code, rec.Body)
	}
	// Reads take the read token, not the action token's absence.
	req := httptest.NewRequest("GET", "/api/v1/pipelines", nil)
	rec := httptest.NewRecorder()
	on.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("a read without http.token: %d", rec.Code)
	}
	audits := append(logs.FilterMessage("audit").All(), logs2.FilterMessage("audit").All()...)
	if len(audits) != 6 {
		t.Fatalf("%d audit lines, want 6 (one per action request)", len(audits))
	}
	last := audits[len(audits)-1].ContextMap()
	if last["who"] != "192.0.2.7:4000" || last["actor"] != "alice" || last["what"] != "POST /api/v1/pipelines/{name}/resume" ||
		last["pipeline"] != "a" || last["status"] != int64(http.StatusConflict) || last["result"] != "pipeline a is not paused" || last["when"] == nil {
		t.Errorf("audit line: %v", last)
	}
	if first := audits[1].ContextMap(); first["status"] != int64(http.StatusUnauthorized) || !strings.Contains(first["result"].(string), "unauthorized") {
		t.Errorf("a refused action's audit line: %v", first)
	}
}

// TestConsoleSessionCSRF: the console signs in with the action token and
// gets an HttpOnly SameSite=Strict cookie and a CSRF token. An action with
// the cookie but without the token, or with a wrong one, is refused (403)
// and audited; with both it is authorised. A session of the read token
// reads but may not act; a signed-out session is refused (401).
func TestConsoleSessionCSRF(t *testing.T) {
	_, h, logs := testProcess(t, config.HTTP{Token: "read", ActionToken: "act"})
	do := func(method, path, body string, cookie *http.Cookie, csrf string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if cookie != nil {
			req.AddCookie(cookie)
		}
		if csrf != "" {
			req.Header.Set("X-CSRF-Token", csrf)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	signIn := func(token string) (*http.Cookie, string) {
		rec := do("POST", "/api/v1/session", `{"token":"`+token+`"}`, nil, "")
		var st struct {
			Actions   bool   `json:"actions"`
			CSRFToken string `json:"csrf_token"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &st); rec.Code != 200 || err != nil || st.CSRFToken == "" {
			t.Fatalf("sign in with %q: %d %s", token, rec.Code, rec.Body)
		}
		cookies := rec.Result().Cookies()
		if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Name != "outboxrelay_session" {
			t.Fatalf("sign-in cookie: %+v", cookies)
		}
		if st.Actions != (token == "act") {
			t.Errorf("sign in with %q: actions %v", token, st.Actions)
		}
		return cookies[0], st.CSRFToken
	}
	if rec := do("POST", "/api/v1/session", `{"token":"guess"}`, nil, ""); rec.Code != http.StatusUnauthorized || len(rec.Result().Cookies()) != 0 {
		t.Errorf("sign in with a wrong token: %d %v", rec.Code, rec.Result().Cookies())
	}
	cookie, csrf := signIn("act")
	const resume = "/api/v1/pipelines/a/resume"
	if rec := do("POST", resume, "", cookie, ""); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "X-CSRF-Token") {
		t.Errorf("an action with the cookie and no CSRF token: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", resume, "", cookie, csrf+"x"); rec.Code != http.StatusForbidden {
		t.Errorf("an action with a wrong CSRF token: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", resume, "", nil, csrf); rec.Code != http.StatusUnauthorized {
		t.Errorf("an action with the CSRF token and no cookie: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", resume, "", cookie, csrf); rec.Code != http.StatusConflict {
		t.Errorf("an action with the cookie and its CSRF token: %d %s, want 409 (authorised; not paused)", rec.Code, rec.Body)
	}
	if rec := do("GET", "/api/v1/pipelines", "", cookie, ""); rec.Code != http.StatusOK {
		t.Errorf("a read with the session: %d %s", rec.Code, rec.Body)
	}
	if rec := do("GET", "/api/v1/session", "", cookie, ""); !strings.Contains(rec.Body.String(), csrf) {
		t.Errorf("the session does not hand its CSRF token again: %s", rec.Body)
	}
	readCookie, readCSRF := signIn("read")
	if rec := do("GET", "/api/v1/history", "", readCookie, ""); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"name":"a"`) {
		t.Errorf("history with the read session: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", resume, "", readCookie, readCSRF); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "only read") {
		t.Errorf("an action of the read session: %d %s", rec.Code, rec.Body)
	}
	if rec := do("DELETE", "/api/v1/session", "", cookie, ""); rec.Code != http.StatusForbidden {
		t.Errorf("sign-out without the CSRF token: %d", rec.Code)
	}
	if rec := do("DELETE", "/api/v1/session", "", cookie, csrf); rec.Code != http.StatusOK {
		t.Errorf("sign-out: %d %s", rec.Code, rec.Body)
	}
	if rec := do("POST", resume, "", cookie, csrf); rec.Code != http.StatusUnauthorized {
		t.Errorf("an action of a signed-out session: %d %s", rec.Code, rec.Body)
	}
	if rec := do("GET", "/ui/", "", nil, ""); rec.Code != http.StatusOK || rec.Header().Get("Content-Security-Policy") == "" {
		t.Errorf("the page, before signing in: %d %v", rec.Code, rec.Header())
	}

	// Every sign-in, action and sign-out, refused or not, is audited.
	var refusedCSRF, session int
	for _, e := range logs.FilterMessage("audit").All() {
		m := e.ContextMap()
		if m["via"] == "session" {
			session++
		}
		if m["status"] == int64(http.StatusForbidden) && strings.Contains(m["result"].(string), "X-CSRF-Token") && m["what"] == "POST /api/v1/pipelines/{name}/resume" {
			refusedCSRF++
		}
	}
	if all := len(logs.FilterMessage("audit").All()); all != 11 {
		t.Errorf("%d audit lines, want 11 (3 sign-ins, 6 actions, 2 sign-outs)", all)
	}
	if refusedCSRF != 2 {
		t.Errorf("%d audit lines of actions refused for the CSRF token, want 2", refusedCSRF)
	}
	if session != 7 {
		t.Errorf("%d audit lines say via session, want 7 (5 actions and 2 sign-outs with the cookie)", session)
	}
}
