package rabbitmq

import (
	"net/url"
	"strings"
)

// redacted replaces a password wherever one would be shown.
const redacted = "xxxxx"

// redactURL returns raw with the password of its userinfo replaced by
// xxxxx: amqp://user:xxxxx@host:5672/vhost. It works on URLs that do not
// parse too, because those end up in error messages as well.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	_, at, colon, ok := userinfo(raw)
	if !ok || colon < 0 {
		return raw
	}
	return raw[:colon+1] + redacted + raw[at:]
}

// userinfo locates the userinfo of a URL-like string without parsing it:
// it starts at start and ends at the '@' at index at; colon is the index of
// the ':' before the password, or -1.
func userinfo(raw string) (start, at, colon int, ok bool) {
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	authority := raw[start:]
	if i := strings.IndexAny(authority, "/?#"); i >= 0 {
		authority = authority[:i]
	}
	a := strings.LastIndexByte(authority, '@')
	if a < 0 {
		return 0, 0, 0, false
	}
	colon = -1
	if c := strings.IndexByte(authority[:a], ':'); c >= 0 {
		colon = start + c
	}
	return start, start + a, colon, true
}

// password returns the password in raw as written and percent-decoded, or
// nothing when raw has none.
func password(raw string) []string {
	_, at, colon, ok := userinfo(raw)
	if !ok || colon < 0 || colon+1 >= at {
		return nil
	}
	p := raw[colon+1 : at]
	out := []string{p}
	if d, err := url.PathUnescape(p); err == nil && d != p {
		out = append(out, d)
	}
	return out
}

// redactError returns err with rawURL and its password removed from its
// message. Libraries quote the URL they failed to parse (net/url does), so
// every error that may carry the URL goes through here. The result still
// unwraps to err, so errors.Is and errors.As keep working.
func redactError(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := msg
	if rawURL != "" {
		clean = strings.ReplaceAll(clean, rawURL, redactURL(rawURL))
	}
	for _, p := range password(rawURL) {
		clean = strings.ReplaceAll(clean, p, redacted)
	}
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
