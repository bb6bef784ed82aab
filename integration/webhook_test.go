package integration

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The webhook sink end to end through the relay binary: a receiver that
// fails about 30% of requests (5xx, 429 with Retry-After, hangs past the
// sink's timeout), a kill -9 of the relay mid-way, and an aggregate whose
// every request the receiver refuses with 422.

const e2eWebhookSecret = "whsec_c2VjcmV0LWtleS1mb3Itb3V0Ym94cmVsYXk="

// hookReceiver is the ledger's receiving side: it checks every request's
// Standard Webhooks signature and records the first 2xx arrival of each
// message, per aggregate, in order.
type hookReceiver struct {
	srv *httptest.Server

	mu        sync.Mutex
	requests  int
	faults    map[string]int // injected: 500, 429, hang
	refused   int            // 422 answers of the refused aggregate
	badSig    []string
	got       []delivered // 2xx answers in arrival order, repeats kept
	seen      map[string]bool
	pauses    []time.Time // when a 429 with Retry-After: 1 was answered
	arrivals  []time.Time
	dups      int
	quit      chan struct{}
	closeOnce sync.Once
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{faults: map[string]int{}, seen: map[string]bool{}, quit: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.closeOnce.Do(func() { close(r.quit) })
		r.srv.Close()
	})
	return r
}

func (r *hookReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusNoContent) // the relay's probe at start
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	r.mu.Lock()
	r.requests++
	n := r.requests
	r.arrivals = append(r.arrivals, time.Now())
	if err := verifyStandardWebhook(req.Header, body); err != nil {
		r.badSig = append(r.badSig, err.Error())
	}
	agg := req.Header.Get("aggregate_id")
	var fault string
	switch {
	case agg == "refused":
		r.refused++
	case n%10 == 3 || n%10 == 7: // 20%
		fault = "500"
	case n%10 == 5: // 10%, of which half hang and half are rate limited
		if n%20 == 5 {
			fault = "hang"
		} else {
			fault = "429"
			r.pauses = append(r.pauses, time.Now())
		}
	}
	if fault != "" {
		r.faults[fault]++
	}
	r.mu.Unlock()

	switch {
	case agg == "refused":
		http.Error(w, "unprocessable: aggregate refused is closed", http.StatusUnprocessableEntity)
	case fault == "500":
		http.Error(w, "injected failure", http.StatusInternalServerError)
	case fault == "429":
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	case fault == "hang":
		select { // past the sink's timeout of 500ms
		case <-time.After(3 * time.Second):
		case <-r.quit:
		}
	default:
		var env map[string]any
		if err := json.Unmarshal(body, &env); err != nil {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		id := req.Header.Get("webhook-id")
		r.mu.Lock()
		if r.seen[id] {
			r.dups++
		}
		r.seen[id] = true
		r.got = append(r.got, delivered{id: id, key: agg, env: env})
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

// verifyStandardWebhook checks the headers as the Standard Webhooks
// specification defines them, independently of the sink's code.
func verifyStandardWebhook(h http.Header, body []byte) error {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(e2eWebhookSecret, "whsec_"))
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	var sec int64
	if _, err := fmt.Sscan(ts, &sec); err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return fmt.Errorf("message %s: webhook-timestamp %q outside 5 minutes", id, ts)
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	if want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)); h.Get("webhook-signature") != want {
		return fmt.Errorf("message %s: webhook-signature %q, want %q", id, h.Get("webhook-signature"), want)
	}
	if id == "" || id != h.Get("message_id") {
		return fmt.Errorf("webhook-id %q, message_id %q", id, h.Get("message_id"))
	}
	return nil
}

// delivered returns how many distinct messages were answered 2xx.
func (r *hookReceiver) delivered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

func (r *hookReceiver) waitDelivered(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for r.delivered() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages delivered within %s", r.delivered(), n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func webhookSinkYAML(url string) string {
	return fmt.Sprintf(`  webhook:
    url: "%s/hooks/{aggregate_type}?event={event_type}"
    secret: %s
    timeout: 500ms
    max_conns_per_host: 8
relay:
  max_attempts: 2`, url, e2eWebhookSecret)
}

func TestWebhookEndToEnd(t *testing.T) {
	e := newEnv(t)
	r := newHookReceiver(t)
	sinkYAML := webhookSinkYAML(r.srv.URL)

	ids := map[string][]string{}
	aggs := []string{"1", "2", "3", "4"}
	var refused []string
	insert := func(rounds int) {
		for range rounds {
			for _, agg := range aggs {
				ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, 20)...)
			}
			refused = append(refused, e.insert("public.outbox", "order", "refused", 2)...)
		}
	}
	p := e.startSinkRelay("webhook", sinkYAML)
	insert(3)
	// Crash once about half of the first rows are in: the restarted relay
	// sends the unconfirmed ones again.
	r.waitDelivered(t, 120, 3*time.Minute)
	p.kill()
	killedAt := time.Now()
	if atKill, first := r.delivered(), 3*20*len(aggs); atKill >= first {
		t.Errorf("the kill came after all %d rows of the first run were delivered (%d): it tested no crash mid-way", first, atKill)
	}
	insert(3)
	want := 0
	for _, list := range ids {
		want += len(list)
	}
	p = e.startSinkRelay("webhook", sinkYAML)
	r.waitDelivered(t, want, 5*time.Minute)

	// Metrics carry the sink's name and the URL without its query.
	_, body := get(t, "http://"+p.httpAddr()+"/metrics")
	series := fmt.Sprintf(`{destination="%s/hooks/order",sink="webhook",slot="outboxrelay"}`, r.srv.URL)
	if n := metricValues(body, "outboxrelay_messages_published_total")[series]; n < 1 {
		t.Errorf("outboxrelay_messages_published_total%s = %v, want some: %v", series, n, metricValues(body, "outboxrelay_messages_published_total"))
	}
	if errs := metricValues(body, "outboxrelay_publish_errors_total"); sum(errs) < 1 {
		t.Errorf("outboxrelay_publish_errors_total = %v, want the injected faults counted", errs)
	} else {
		t.Logf("publish errors of the restarted relay: %v", errs)
	}

	// The refused aggregate: its first row is a dead letter with the
	// receiver's status and answer, the rows behind it are parked.
	var letters, parked, withStatus int
	deadline := time.Now().Add(60 * time.Second)
	for {
		e.db.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE error LIKE '%422 Unprocessable Entity%' AND error LIKE '%aggregate refused is closed%')
			FROM outboxrelay.dead_letters WHERE aggregate_id = 'refused'`).Scan(&letters, &withStatus)
		e.db.QueryRow(t.Context(), `SELECT count(DISTINCT message_id) FROM outboxrelay.parked WHERE aggregate_id = 'refused'`).Scan(&parked)
		if letters+parked >= len(refused) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.stop()

	// verify cannot read a receiver back, and says so.
	verifyCfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\nsink:\n  type: webhook\n%s\n", e.dbURL, sinkYAML))
	if out, code := e.cli("verify", "--config", verifyCfg, "--since", "1h"); code != 2 || !strings.Contains(out, "a webhook receiver cannot be read back") {
		t.Errorf("verify with the webhook sink: exit %d, %s; want exit 2 and the refusal", code, out)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	checkCommitOrder(t, ids, r.got)
	lost := 0
	for _, list := range ids {
		for _, id := range list {
			if !r.seen[id] {
				lost++
			}
		}
	}
	for _, id := range refused {
		if r.seen[id] {
			t.Errorf("refused message %s was answered 2xx", id)
		}
	}
	t.Logf("ledger: %d rows committed (%d delivered-to aggregates, %d refused), %d requests, %d lost, %d duplicates, faults %v, %d answered 422; %d dead letters (%d with status 422 and the answer), %d parked",
		want+len(refused), want, len(refused), r.requests, lost, r.dups, r.faults, r.refused, letters, withStatus, parked)
	if lost != 0 {
		t.Errorf("%d messages lost", lost)
	}
	if letters < 1 || withStatus != letters || letters+parked != len(refused) {
		t.Errorf("refused aggregate: %d dead letters (%d with the 422 status and answer) and %d parked, want %d in all with the status",
			letters, withStatus, parked, len(refused))
	}
	for _, s := range r.badSig {
		t.Errorf("signature: %s", s)
	}
	if r.faults["500"] < 20 || r.faults["429"] < 5 || r.faults["hang"] < 5 {
		t.Errorf("faults injected %v, want at least 20 500s, 5 429s and 5 hangs", r.faults)
	}
	if frac := float64(r.faults["500"]+r.faults["429"]+r.faults["hang"]) / float64(r.requests); frac < 0.2 {
		t.Errorf("%.0f%% of requests failed, want about 30%%", 100*frac)
	}
	// Retry-After: 1 holds every request for a second. Requests sent
	// before the 429 reached the sink may still arrive just after it, and
	// a pause does not outlive the relay that was told it (the kill).
	early, acrossKill := 0, 0
	for _, p := range r.pauses {
		for _, a := range r.arrivals {
			if a.After(p.Add(300*time.Millisecond)) && a.Before(p.Add(900*time.Millisecond)) {
				if p.Before(killedAt) && a.After(killedAt) {
					acrossKill++
					continue
				}
				early++
			}
		}
	}
	t.Logf("%d requests of the restarted relay came within a second of a 429 the killed relay was told", acrossKill)
	if early > 0 {
		t.Errorf("%d requests arrived within a second of a 429 with Retry-After: 1", early)
	}
}

// TestWebhookBadInput: an unreachable receiver, an invalid URL template
// and a missing secret are each one clear error at start, exit 2, and no
// slot is created.
func TestWebhookBadInput(t *testing.T) {
	e := newEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	for _, c := range []struct {
		name, sink string
		want       string
	}{
		{"unreachable", fmt.Sprintf("  webhook:\n    url: http://%s/hooks\n    secret: %s", closed, e2eWebhookSecret),
			"cannot reach the webhook receiver at http://" + closed + "/"},
		{"template", fmt.Sprintf("  webhook:\n    url: \"http://{aggregate_type}.example.com/hooks\"\n    secret: %s", e2eWebhookSecret),
			"sink.webhook.url: URL http://{aggregate_type}.example.com/hooks has a placeholder in its scheme or host"},
		{"unknown placeholder", fmt.Sprintf("  webhook:\n    url: \"http://127.0.0.1:1/{aggregatetype}\"\n    secret: %s", e2eWebhookSecret),
			"unknown placeholder {aggregatetype}"},
		{"missing secret", "  webhook:\n    url: http://127.0.0.1:1/hooks",
			"sink.webhook.secret is empty; set it, or sink.webhook.secret_file"},
		{"missing secret file", "  webhook:\n    url: http://127.0.0.1:1/hooks\n    secret_file: /nonexistent/whsec",
			"sink.webhook.secret_file: stat /nonexistent/whsec"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkBadStart(t, e, "webhook_bad_"+strings.ReplaceAll(c.name, " ", "_"), "webhook", c.sink, c.want)
		})
	}
}

// checkBadStart starts the relay with the sink section sinkYAML of type
// sinkType and slot slot, and fails t unless it exits 2 with want in its
// one line of error, no stack trace, and no slot created.
func checkBadStart(t *testing.T, e *env, slot, sinkType, sinkYAML, want string) {
	t.Helper()
	cfg := fmt.Sprintf("postgres:\n  url: %s\n  slot: %s\nsink:\n  type: %s\n%s\nhttp:\n  listen: 127.0.0.1:0\n", e.dbURL, slot, sinkType, sinkYAML)
	out, code := e.cliConfig(cfg)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	t.Logf("exit %d: %s", code, last)
	if code != 2 || !strings.Contains(last, want) {
		t.Errorf("exit %d, last line %q; want exit 2 and %q\n%s", code, last, want, out)
	}
	var plain []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") { // the relay's log lines are JSON
			plain = append(plain, l)
		}
	}
	if len(plain) != 1 {
		t.Errorf("%d lines of error, want one:\n%s", len(plain), strings.Join(plain, "\n"))
	}
	if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic") {
		t.Errorf("output has a stack trace:\n%s", out)
	}
	var exists bool
	if err := e.db.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("slot %s was created by a start that failed", slot)
	}
}
