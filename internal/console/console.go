// Package console is the operator's web page that a process of many
// pipelines serves at /ui: static files embedded in the binary (HTML, CSS
// and JavaScript without a framework, nothing fetched at run time), the
// sign-in sessions that let the page act (an HttpOnly cookie and a CSRF
// token), and the in-process history of each pipeline's lag that its chart
// draws. It serves no data itself: the page reads and acts through the
// management API (internal/app).
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed ui
var files embed.FS

// Policy is the Content-Security-Policy of the page: its own scripts,
// styles and API, nothing else (no inline script, no other origin, no
// framing), so that a payload shown on the page can never run.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the page's files under prefix (for example "/ui/").
// It is safe for concurrent use.
func Handler(prefix string) http.Handler {
	sub, err := fs.Sub(files, "ui")
	if err != nil {
		panic(err) // the embedded tree always has ui/
	}
	static := http.StripPrefix(prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", Policy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		// The page changes with the binary; a stale copy after an upgrade
		// would call an API that moved.
		h.Set("Cache-Control", "no-cache")
		static.ServeHTTP(w, r)
	})
}
