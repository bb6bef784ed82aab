// Package redact hides passwords in connection URLs, key=value DSNs and the
// error texts that quote them, so that they can be logged, printed and
// stored. It is the one copy the config printer, cdc, the admin server and
// the sinks use.
//
// A NATS URL may carry a token in place of a user name (nats://token@host):
// for the schemes nats, tls, ws and wss a lone user name counts as a secret.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask is what a hidden secret is shown as.
const Mask = "xxxxx"

var (
	// passwordInText matches password=... in a DSN or a message quoting one
	// (sslpassword too), quoted or not.
	passwordInText = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)
	// userinfoInText matches the user:password@ of a URL inside a text.
	userinfoInText = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
)

// URL returns s with its passwords hidden: the userinfo password of a URL
// (or of each URL in a comma-separated list, as NATS takes), the value of
// every query parameter whose name contains "password" (sslpassword), a
// NATS token, password=... in a key=value DSN, and the password of a
// user:password@host without a scheme. Everything else reads as written,
// URLs that do not parse included.
func URL(s string) string {
	if !strings.Contains(s, "://") {
		return bare(s)
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = one(p)
	}
	return strings.Join(parts, ",")
}

// one redacts one URL of a list, keeping the white space around it.
func one(p string) string {
	raw := strings.TrimSpace(p)
	if raw == "" {
		return p
	}
	lead := p[:strings.Index(p, raw)]
	trail := p[len(lead)+len(raw):]
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return lead + unparsed(raw) + trail
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else if token(u.Scheme) && u.User.Username() != "" {
			u.User = url.User(Mask)
		}
	}
	// Query parameters are redacted in place, so that the rest of the
	// query reads as written.
	if u.RawQuery != "" {
		params := strings.Split(u.RawQuery, "&")
		for i, q := range params {
			k, _, ok := strings.Cut(q, "=")
			if key, err := url.QueryUnescape(k); ok && (err != nil || strings.Contains(strings.ToLower(key), "password")) {
				params[i] = k + "=" + Mask
			}
		}
		u.RawQuery = strings.Join(params, "&")
	}
	return lead + u.String() + trail
}

// unparsed redacts a URL that net/url refuses (a bad escape, a password
// with a slash): libraries quote those in their errors too.
func unparsed(raw string) string {
	s := Text(raw)
	if start, at, colon, ok := userinfo(s); ok && colon < 0 && token(scheme(s)) {
		s = s[:start] + Mask + s[at:]
	}
	return s
}

// bare redacts what has no scheme: a key=value DSN, or user:password@host.
func bare(s string) string {
	if strings.ContainsAny(s, "= \t\n") {
		return Text(s)
	}
	if _, at, colon, ok := userinfo(s); ok && colon >= 0 {
		return s[:colon+1] + Mask + s[at:]
	}
	return s
}

// Text returns s, a message that may quote connection URLs or DSNs, with
// their passwords hidden: user:password@ after a scheme, and password=...
// wherever it stands.
func Text(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
			s = u.String()
		}
	}
	if strings.Contains(s, "://") {
		s = userinfoInText.ReplaceAllString(s, "${1}"+Mask+"@")
	}
	return passwordInText.ReplaceAllString(s, "${1}"+Mask)
}

// Error returns err with the secrets of rawURL (one URL or a
// comma-separated list) hidden in its text: rawURL itself becomes
// URL(rawURL), and each password or token, as written and percent-decoded,
// becomes Mask. Libraries quote the URL they failed to parse, or the
// password they were refused, so every error that may carry one goes
// through here. The result unwraps to err, so errors.Is and errors.As keep
// working; an err with nothing to hide is returned as it is.
func Error(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := msg
	if rawURL != "" {
		clean = strings.ReplaceAll(clean, rawURL, URL(rawURL))
	}
	for _, p := range secrets(rawURL) {
		clean = strings.ReplaceAll(clean, p, Mask)
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

// secrets lists the passwords and tokens in raw, as written and decoded.
func secrets(raw string) []string {
	var out []string
	add := func(s string) {
		if s == "" || s == Mask {
			return
		}
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
	}
	for _, p := range strings.Split(raw, ",") {
		p = strings.TrimSpace(p)
		start, at, colon, ok := userinfo(p)
		switch {
		case !ok:
		case colon >= 0:
			add(p[colon+1 : at])
		case token(scheme(p)):
			add(p[start:at])
		}
	}
	return out
}

// userinfo locates the userinfo of a URL-like string without parsing it:
// it starts at start and ends at the '@' at index at; colon is the index of
// the ':' before the password, or -1. The last '@' before any white space
// ends it, so that a password holding '/' or '#' is found too.
func userinfo(raw string) (start, at, colon int, ok bool) {
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	rest := raw[start:]
	if i := strings.IndexAny(rest, " \t\n"); i >= 0 {
		rest = rest[:i]
	}
	a := strings.LastIndexByte(rest, '@')
	if a < 0 {
		return 0, 0, 0, false
	}
	colon = -1
	if c := strings.IndexByte(rest[:a], ':'); c >= 0 {
		colon = start + c
	}
	return start, start + a, colon, true
}

func scheme(raw string) string {
	s, _, _ := strings.Cut(raw, "://")
	return strings.ToLower(s)
}

// token reports whether a lone user name is a secret for scheme: NATS
// takes a token there.
func token(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "nats", "tls", "ws", "wss":
		return true
	}
	return false
}
