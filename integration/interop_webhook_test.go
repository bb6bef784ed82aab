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
// accept every request, and one with another secret accepts none. It does
// so per message and in batch mode, where one signature covers a JSON
// array of envelopes.
func TestStandardWebhooksVerifies(t *testing.T) {
	mods := interopNodeModules(t)
	if _, err := os.Stat(filepath.Join(mods, "standardwebhooks", "package.json")); err != nil {
		missingClient(t, "npm package standardwebhooks", "run .ci/interop-deps")
	}
	// Not parallel: the relays of both would take the one default slot
	// name of the shared server.
	t.Run("per message", func(t *testing.T) { checkStandardWebhooks(t, mods, "") })
	// One connection, so one worker gathers the ready aggregates' heads
	// into a batch instead of each of several taking one.
	t.Run("batch", func(t *testing.T) {
		checkStandardWebhooks(t, mods, "\n    max_conns_per_host: 1\n    batch:\n      max_messages: 10\n      linger: 100ms")
	})
}

// hookRequest is one captured request, as webhook-verify.js reads it.
type hookRequest struct {
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// messageIDs returns the message ids a request carries: the envelopes'
// of a batch (a JSON array), or its webhook-id.
func (c hookRequest) messageIDs(t *testing.T) []string {
	body, err := base64.StdEncoding.DecodeString(c.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(body, []byte("[")) {
		return []string{c.Headers["webhook-id"]}
	}
	var envs []struct {
		ID string `json:"message_id"`
	}
	if err := json.Unmarshal(body, &envs); err != nil {
		t.Fatalf("batch %s is not a JSON array of envelopes: %v", c.Headers["webhook-id"], err)
	}
	ids := make([]string, len(envs))
	for i, e := range envs {
		ids[i] = e.ID
	}
	return ids
}

// checkStandardWebhooks runs the relay with the webhook sink (and batch,
// the YAML of more of its settings) against a receiver that captures
// every request, and has webhook-verify.js verify each with the new, the
// old and another secret.
func checkStandardWebhooks(t *testing.T, mods, batch string) {
	const (
		newSecret   = "whsec_bmV3LXNlY3JldC1mb3Itb3V0Ym94cmVsYXktcm90YXRpb24="
		oldSecret   = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		otherSecret = "whsec_b3RoZXItc2VjcmV0LW5vdC1jb25maWd1cmVk"
	)
	var mu sync.Mutex
	var reqs []hookRequest
	delivered := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		c := hookRequest{Headers: map[string]string{}, Body: base64.StdEncoding.EncodeToString(body)}
		for k := range r.Header {
			c.Headers[strings.ToLower(k)] = r.Header.Get(k)
		}
		mu.Lock()
		reqs = append(reqs, c)
		for _, id := range c.messageIDs(t) {
			delivered[id] = true
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	e := newEnv(t)
	p := e.startSinkRelay("webhook", `  webhook:
    url: "`+srv.URL+`/hooks/{aggregate_type}"
    secret: "`+newSecret+` `+oldSecret+`"`+batch)
	ids := e.insert("public.outbox", "order", "1", 20)
	var odd string
	if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', '2', 'order.created', '{"name": "Zoë ✓ 日本", "esc": "a\"b\\c"}', '{"tenant": "acme"}') RETURNING id::text`).Scan(&odd); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, odd)
	// Rows of 8 aggregates committed together: batch mode puts one of
	// each aggregate in a request.
	rows, err := e.db.Query(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'b' || (i % 8), 'order.created', jsonb_build_object('i', i) FROM generate_series(1, 40) i RETURNING id::text`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	deadline := time.Now().Add(45 * time.Second)
	for {
		mu.Lock()
		n := len(delivered)
		mu.Unlock()
		if n >= len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages delivered within 45s", n, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()

	var in bytes.Buffer
	mu.Lock()
	captured := append([]hookRequest(nil), reqs...)
	mu.Unlock()
	for _, c := range captured {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(b, '\n'))
	}
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
	verified := map[string]bool{}
	var lines, batches, inBatches int
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
		if lines >= len(captured) || r.ID != captured[lines].Headers["webhook-id"] {
			t.Fatalf("webhook-verify.js answered %q as request %d of %d", r.ID, lines, len(captured))
		}
		msgs := captured[lines].messageIDs(t)
		lines++
		if len(r.OK) != 3 || !r.OK[0] || !r.OK[1] || r.OK[2] {
			t.Errorf("request %s (%d messages): verified with the new, old and another secret: %v %q; want true, true, false", r.ID, len(msgs), r.OK, r.Errors)
			continue
		}
		if len(msgs) > 1 {
			batches++
			inBatches += len(msgs)
		}
		for _, id := range msgs {
			verified[id] = true
		}
	}
	if lines != len(captured) {
		t.Errorf("webhook-verify.js answered %d of %d requests", lines, len(captured))
	}
	for _, id := range ids {
		if !verified[id] {
			t.Errorf("message %s was not in a verified request", id)
		}
	}
	t.Logf("standardwebhooks verified %d requests (%d batches holding %d messages) carrying %d messages with either secret, none with another",
		lines, batches, inBatches, len(ids))
	if batch != "" && batches < 2 {
		t.Errorf("%d batches of more than one message were sent, want at least 2: batch mode was not exercised", batches)
	}
	if batch == "" && batches != 0 {
		t.Errorf("%d batches sent without batch mode", batches)
	}
}
