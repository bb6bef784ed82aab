package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStandardWebhooksVerifies: the standardwebhooks npm package verifies
// the signatures of the relay's webhook sink while a secret is rotated,
// the relay configured with the new and the old secret: a receiver that
// knows only the new one and a receiver that knows only the old one both
// accept every request, and one with another secret accepts none.
func TestStandardWebhooksVerifies(t *testing.T) {
	mods := interopNodeModules(t)
	if _, err := os.Stat(filepath.Join(mods, "standardwebhooks", "package.json")); err != nil {
		missingClient(t, "npm package standardwebhooks", "run .ci/interop-deps")
	}
	const (
		newSecret   = "whsec_bmV3LXNlY3JldC1mb3Itb3V0Ym94cmVsYXktcm90YXRpb24="
		oldSecret   = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		otherSecret = "whsec_b3RoZXItc2VjcmV0LW5vdC1jb25maWd1cmVk"
	)
	type captured struct {
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	var mu sync.Mutex
	var reqs []captured
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		c := captured{Headers: map[string]string{}, Body: base64.StdEncoding.EncodeToString(body)}
		for k := range r.Header {
			c.Headers[strings.ToLower(k)] = r.Header.Get(k)
		}
		mu.Lock()
		reqs = append(reqs, c)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	e := newEnv(t)
	p := e.startSinkRelay("webhook", `  webhook:
    url: "`+srv.URL+`/hooks/{aggregate_type}"
    secret: "`+newSecret+` `+oldSecret+`"`)
	ids := e.insert("public.outbox", "order", "1", 20)
	var odd string
	e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', '2', 'order.created', '{"name": "Zoë ✓ 日本", "esc": "a\"b\\c"}', '{"tenant": "acme"}') RETURNING id::text`).Scan(&odd)
	ids = append(ids, odd)
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := len(reqs)
		mu.Unlock()
		if n >= len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests within 60s", n, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()

	var in bytes.Buffer
	mu.Lock()
	for _, c := range reqs {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(b, '\n'))
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "interop/webhook-verify.js", newSecret, oldSecret, otherSecret)
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node webhook-verify.js: %v\n%s", err, stderr.String())
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r struct {
			ID     string   `json:"id"`
			OK     []bool   `json:"ok"`
			Errors []string `json:"errors"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("webhook-verify.js printed %q: %v", sc.Text(), err)
		}
		seen[r.ID] = true
		if len(r.OK) != 3 || !r.OK[0] || !r.OK[1] || r.OK[2] {
			t.Errorf("message %s: verified with the new, old and another secret: %v %q; want true, true, false", r.ID, r.OK, r.Errors)
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("message %s was not verified", id)
		}
	}
	t.Logf("standardwebhooks verified %d requests (%d messages) with either secret", len(seen), len(ids))
}
