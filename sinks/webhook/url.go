package webhook

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/route"
)

// endpoint is a parsed URL template: where every request goes (scheme,
// user info, host and port, fixed) and the template of its path and query.
type endpoint struct {
	tmpl   route.Template
	scheme string
	host   string // host[:port], as url.URL.Host
	origin string // scheme://host/, for the probe at start
}

// escape percent-encodes every byte of a placeholder's value but the
// unreserved characters of RFC 3986, so that a value can add no path
// segment, query parameter, fragment or user info.
var escape = route.EscapeFunc(func(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return false
	case c == '-' || c == '.' || c == '_' || c == '~':
		return false
	}
	return true
})

// parseURL parses the template s. Placeholders may stand only after the
// authority, in the path or the query: the host a request goes to is the
// operator's choice, never a row's (no request forgery through row
// content).
func parseURL(s string) (endpoint, error) {
	if s == "" {
		return endpoint{}, errors.New("the URL is empty; set it to the receiver's URL, such as https://hooks.example.com/outbox/{aggregate_type}")
	}
	t, err := route.Parse(s)
	if err != nil {
		return endpoint{}, fmt.Errorf("URL %w", err) // "URL template ..."
	}
	_, rest, ok := strings.Cut(s, "://")
	if !ok {
		return endpoint{}, fmt.Errorf("URL %s has no scheme; start it with https:// or http://", redact.URL(s))
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	prefix := s[:len(s)-len(rest)] + authority
	if strings.ContainsAny(prefix, "{}") {
		return endpoint{}, fmt.Errorf("URL %s has a placeholder in its scheme or host; placeholders may stand only in the path and the query, so that a row cannot choose the host its request goes to", redact.URL(s))
	}
	// The literal text must make a valid URL whatever the values: parse
	// it with a stand-in for each.
	u, err := url.Parse(strings.NewReplacer("{aggregate_type}", "x", "{event_type}", "x", "{table}", "x").Replace(s))
	if err != nil {
		return endpoint{}, fmt.Errorf("URL %s is not a URL (%v); use https://host/path", redact.URL(s), redact.Error(err, s))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return endpoint{}, fmt.Errorf("URL %s has scheme %q; use https:// or http://", redact.URL(s), u.Scheme)
	}
	if u.Host == "" || u.Hostname() == "" {
		return endpoint{}, fmt.Errorf("URL %s has no host; use https://host/path", redact.URL(s))
	}
	if u.Fragment != "" || strings.Contains(s, "#") {
		return endpoint{}, fmt.Errorf("URL %s has a fragment (#...), which is never sent; remove it", redact.URL(s))
	}
	return endpoint{tmpl: t, scheme: u.Scheme, host: u.Host, origin: u.Scheme + "://" + u.Host + "/"}, nil
}

// render returns m's request URL, or an error when the rendered URL would
// not address the configured host or would hold a dot segment ("." or
// ".." between slashes), which a server may resolve to another path.
func (e endpoint) render(m *relay.Message) (*url.URL, error) {
	// The rule of every sink (valid UTF-8, no name of the relay's own),
	// on the values as the row holds them: escaped, any bytes would pass.
	if err := sinks.CheckDestination("webhook URL", e.tmpl.Render(m, nil)); err != nil {
		return nil, err
	}
	raw := e.tmpl.Render(m, escape)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("the webhook URL rendered for this message is invalid: %w", redact.Error(err, raw))
	}
	if u.Scheme != e.scheme || u.Host != e.host {
		// Unreachable with escaped values; kept so that a change of the
		// escaping can never let a row pick the host.
		return nil, errors.New("the webhook URL rendered for this message addresses another host than sink.webhook.url")
	}
	for _, seg := range strings.Split(u.EscapedPath(), "/") {
		if seg == "." || seg == ".." || strings.EqualFold(seg, "%2e") || strings.EqualFold(seg, "%2e%2e") ||
			strings.EqualFold(seg, ".%2e") || strings.EqualFold(seg, "%2e.") {
			return nil, fmt.Errorf("the webhook URL rendered for this message has the path segment %q, which a server may resolve to another path", seg)
		}
	}
	return u, nil
}

// destination is u as metrics and dead letters show it: without user info
// and query, which may carry credentials.
func destination(u *url.URL) string {
	v := *u
	v.User, v.RawQuery, v.ForceQuery = nil, "", false
	return v.String()
}
