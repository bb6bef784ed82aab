package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// The cookie and header of a console session.
const (
	// CookieName holds the session id: HttpOnly, so the page's script
	// never sees it, and SameSite=Strict, so another site's page cannot
	// make the browser send it.
	CookieName = "outboxrelay_session"
	// CSRFHeader carries the session's CSRF token on every action. A
	// cross-site form cannot set a header, and a cross-site script cannot
	// read the token (the API sends no CORS headers).
	CSRFHeader = "X-CSRF-Token"
)

// SessionTTL is how long a session lasts from its sign-in.
const SessionTTL = 8 * time.Hour

// maxSessions bounds the sessions kept, so that repeated sign-ins cannot
// grow memory; the oldest goes first.
const maxSessions = 256

// Session is one signed-in browser.
type Session struct {
	// CSRF is the token every action of the session must send in
	// CSRFHeader.
	CSRF string
	// Actions is true for a session signed in with http.action_token;
	// one signed in with http.token may only read.
	Actions bool
	Created time.Time
	Expires time.Time
}

// CheckCSRF reports whether got is the session's CSRF token, in a time
// that does not depend on how much of it matches.
func (s Session) CheckCSRF(got string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(s.CSRF))
	return got != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// Sessions holds the console's sessions in memory: a restart signs every
// browser out. It is safe for concurrent use.
type Sessions struct {
	mu   sync.Mutex
	byID map[[32]byte]Session // by the hash of the id: a lookup leaks no timing of the id
	now  func() time.Time
}

// NewSessions returns an empty set of sessions.
func NewSessions() *Sessions {
	return &Sessions{byID: map[[32]byte]Session{}, now: time.Now}
}

// Create starts a session and returns its id (the cookie's value) and
// the session.
func (s *Sessions) Create(actions bool) (string, Session) {
	id, csrf := randomToken(), randomToken()
	now := s.now()
	sess := Session{CSRF: csrf, Actions: actions, Created: now, Expires: now.Add(SessionTTL)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now)
	for len(s.byID) >= maxSessions {
		var oldest [32]byte
		first := true
		for k, v := range s.byID {
			if first || v.Created.Before(s.byID[oldest].Created) {
				oldest, first = k, false
			}
		}
		delete(s.byID, oldest)
	}
	s.byID[sha256.Sum256([]byte(id))] = sess
	return id, sess
}

// expire drops the sessions past their time; s.mu is held.
func (s *Sessions) expire(now time.Time) {
	for k, v := range s.byID {
		if !now.Before(v.Expires) {
			delete(s.byID, k)
		}
	}
}

// Lookup returns the live session of id.
func (s *Sessions) Lookup(id string) (Session, bool) {
	if id == "" {
		return Session{}, false
	}
	key := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.byID[key]
	if ok && !s.now().Before(sess.Expires) {
		delete(s.byID, key)
		return Session{}, false
	}
	return sess, ok
}

// FromRequest returns the live session whose cookie r carries.
func (s *Sessions) FromRequest(r *http.Request) (Session, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return Session{}, false
	}
	return s.Lookup(c.Value)
}

// Delete ends the session of id.
func (s *Sessions) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, sha256.Sum256([]byte(id)))
}

// Cookie is the cookie that carries session id to the browser; secure
// marks it Secure (the request came over HTTPS, directly or through a
// proxy). An empty id clears the cookie.
func Cookie(id string, sess Session, secure bool) *http.Cookie {
	c := &http.Cookie{
		Name: CookieName, Value: id, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure,
	}
	if id == "" {
		c.MaxAge = -1
	} else {
		c.Expires = sess.Expires
		c.MaxAge = int(time.Until(sess.Expires).Seconds())
	}
	return c
}

// randomToken is 256 random bits, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}
