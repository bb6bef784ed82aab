package console

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func i64(v int64) *int64 { return &v }

// TestHistoryRing: the ring keeps the last size samples, oldest first, and
// each sample's throughput is the rise of the total since the one before;
// a fall of the total (a new slot) or an unknown total gives none.
func TestHistoryRing(t *testing.T) {
	h := NewHistory(3)
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	totals := []*int64{i64(0), i64(50), i64(150), nil, i64(10), i64(30)}
	for i, total := range totals {
		h.Add("a", Sample{At: at.Add(time.Duration(i*5) * time.Second), PublishedTotal: total})
	}
	got := h.Samples("a")
	if len(got) != 3 {
		t.Fatalf("%d samples, want the last 3", len(got))
	}
	for i, want := range []time.Duration{15 * time.Second, 20 * time.Second, 25 * time.Second} {
		if got[i].At != at.Add(want) {
			t.Errorf("sample %d at %s, want %s", i, got[i].At, at.Add(want))
		}
	}
	if got[0].PublishedPerSecond != nil || got[1].PublishedPerSecond != nil {
		t.Errorf("a sample after an unknown total has a rate: %v %v", got[0].PublishedPerSecond, got[1].PublishedPerSecond)
	}
	if r := got[2].PublishedPerSecond; r == nil || *r != 4 {
		t.Errorf("rate from 10 to 30 in 5 s: %v, want 4", r)
	}
	h.Add("a", Sample{At: at.Add(30 * time.Second), PublishedTotal: i64(5)})
	if r := h.Samples("a")[2].PublishedPerSecond; r != nil {
		t.Errorf("a total that fell has rate %v, want none", *r)
	}
	if s := h.Samples("none"); s == nil || len(s) != 0 {
		t.Errorf("an unknown pipeline's samples: %v, want empty", s)
	}
}

// TestSessions: a session is found by its id until it expires or is
// deleted; its CSRF token is checked exactly; the number kept is bounded.
func TestSessions(t *testing.T) {
	s := NewSessions()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	id, sess := s.Create(true)
	if got, ok := s.Lookup(id); !ok || !got.Actions || got.CSRF != sess.CSRF {
		t.Fatalf("lookup of a new session: %v %v", got, ok)
	}
	if _, ok := s.Lookup(id + "x"); ok {
		t.Error("another id finds the session")
	}
	if !sess.CheckCSRF(sess.CSRF) || sess.CheckCSRF("") || sess.CheckCSRF(sess.CSRF[1:]) {
		t.Error("CheckCSRF accepts a wrong token or refuses the right one")
	}
	now = now.Add(SessionTTL)
	if _, ok := s.Lookup(id); ok {
		t.Error("an expired session is still found")
	}
	id2, _ := s.Create(false)
	s.Delete(id2)
	if _, ok := s.Lookup(id2); ok {
		t.Error("a deleted session is still found")
	}
	first, _ := s.Create(false)
	for range maxSessions {
		now = now.Add(time.Millisecond)
		s.Create(false)
	}
	if _, ok := s.Lookup(first); ok || len(s.byID) != maxSessions {
		t.Errorf("%d sessions kept (the oldest found: %v), want %d without the oldest", len(s.byID), ok, maxSessions)
	}
	c := Cookie(id, sess, true)
	if !c.HttpOnly || !c.Secure || c.SameSite != 3 || c.Path != "/" {
		t.Errorf("cookie %+v: want HttpOnly, Secure, SameSite=Strict, Path=/", c)
	}
}

// TestHandlerServesThePage: the page and its files come from the binary,
// with a policy that allows nothing but the relay itself.
func TestHandlerServesThePage(t *testing.T) {
	h := Handler("/ui/")
	for path, want := range map[string]string{"/ui/": "<title>outboxrelay console</title>", "/ui/console.js": "X-CSRF-Token", "/ui/console.css": ":focus-visible"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d, body without %q", path, rec.Code, want)
		}
		if rec.Header().Get("Content-Security-Policy") != Policy || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", path, rec.Header())
		}
	}
	// Nothing the page loads comes from elsewhere.
	for _, f := range []string{"ui/index.html", "ui/console.js", "ui/console.css"} {
		b, err := files.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "https://") || strings.Contains(string(b), "//cdn") {
			t.Errorf("%s refers to another origin", f)
		}
	}
}
