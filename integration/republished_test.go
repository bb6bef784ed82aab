package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Issue 49: a run with nothing failing publishes each row once, and every
// message the relay publishes again where it can know it is counted in
// outboxrelay_messages_republished_total{reason} and in status's
// republished_total.

// republishedSeries scrapes the relay's metrics and returns
// outboxrelay_messages_republished_total by label set. Every reason's
// series exists from the start, so an empty map is a failure.
func republishedSeries(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	_, body := get(t, "http://"+addr+"/metrics")
	vals := metricValues(body, "outboxrelay_messages_republished_total")
	if len(vals) == 0 {
		t.Fatalf("no outboxrelay_messages_republished_total series in /metrics")
	}
	return vals
}

// statusRepublished runs `outboxrelay status --json` for slot and returns
// republished_total and its reasons.
func statusRepublished(t *testing.T, e *env, slot string) (int64, map[string]int64) {
	t.Helper()
	out, code := e.cli("status", "--database-url", e.dbURL, "--slot", slot, "--json")
	if code != 0 && code != 1 {
		t.Fatalf("status exited %d: %s", code, out)
	}
	var st struct {
		Total   *int64           `json:"republished_total"`
		Reasons map[string]int64 `json:"republished"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Total == nil {
		t.Fatalf("status --json has no republished_total (%v): %s", err, out)
	}
	return *st.Total, st.Reasons
}

// TestSigtermRestartUnderLoadOnce: rows are committed continuously while
// the relay is stopped with SIGTERM and started again, three times. A
// SIGTERM drains: what the broker acknowledged is confirmed before the
// process exits, so the next one starts where it stopped. Every row
// arrives once, in its aggregate's order, each process counts 0
// republished, and each logs an empty window past the confirmed position.
func TestSigtermRestartUnderLoadOnce(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	load := startLoader(t, e.dbURL, "term", 5*time.Millisecond)
	restarts := 0
	var outs []string
	for i := range 4 {
		p := e.start()
		addr := p.httpAddr()
		p.waitLog(`"streaming"`, 30*time.Second)
		time.Sleep(time.Duration(700+300*i) * time.Millisecond)
		if i == 3 {
			ids := load.stop(t)
			recs := c.waitIDs(ids, 90*time.Second)
			checkOnce(t, "SIGTERM and restart under load", ids, recs)
			t.Logf("SIGTERM and restart under load: rows %d, restarts %d, lost 0, duplicates %d, records %d",
				len(ids), restarts, duplicates(recs), len(recs))
		}
		if got := sum(republishedSeries(t, addr)); got != 0 {
			t.Errorf("run %d: outboxrelay_messages_republished_total = %v, want 0", i, got)
		}
		p.stop()
		outs = append(outs, p.out.String())
		if !strings.Contains(p.out.String(), `"msg":"nothing recorded as published past the slot's confirmed position;`) {
			t.Errorf("run %d did not log an empty window past the confirmed position:\n%s", i, tail(p.out.String(), 20))
		}
		restarts++
	}
	if total, reasons := statusRepublished(t, e, "outboxrelay"); total != 0 {
		t.Errorf("status republished_total = %d %v, want 0", total, reasons)
		for i, out := range outs {
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "retry") || strings.Contains(line, "failed") {
					t.Logf("run %d: %s", i, line)
				}
			}
		}
	}
}

// checkOnce fails the test unless recs hold every id of ids exactly once,
// in its aggregate's commit order.
func checkOnce(t *testing.T, path string, ids []string, recs []record) {
	t.Helper()
	if d := duplicates(recs); d != 0 {
		t.Errorf("%s: %d rows arrived more than once (%d records for %d rows)", path, d, len(recs), len(ids))
	}
	if order := checkOrder(ids, recs); order != 0 {
		t.Errorf("%s: %d records out of their aggregate's order", path, order)
	}
}

// lossyReceiver is a webhook endpoint that loses acknowledgements: it
// stores every request it gets, and answers every fifth one 503, as a
// receiver that stored the message and then failed before it could answer.
// The relay retries those (a retryable failure), and the receiver then holds
// them twice: duplicates the relay can know of, as it publishes again after
// a failure that may have reached the receiver.
type lossyReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests int
	lost     int            // acknowledgements lost
	got      map[string]int // stored copies per message id
	order    []record       // first copies in arrival order (Key: aggregate)
}

func newLossyReceiver(t *testing.T) *lossyReceiver {
	r := &lossyReceiver{got: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *lossyReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusNoContent) // the relay's probe at start
		return
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return
	}
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	r.requests++
	r.got[id]++
	if r.got[id] == 1 {
		r.order = append(r.order, record{Key: req.Header.Get("aggregate_id"), Headers: map[string]string{"message_id": id}})
	}
	lose := r.requests%5 == 0
	if lose {
		r.lost++
	}
	r.mu.Unlock()
	if lose {
		http.Error(w, "stored, but failed before answering", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// figures returns the distinct messages held, the extra copies and the
// acknowledgements lost.
func (r *lossyReceiver) figures() (distinct, dups, lost int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.got {
		dups += n - 1
	}
	return len(r.got), dups, r.lost
}

// TestLostAcknowledgementsCounted: a receiver that stores messages and then
// fails to acknowledge some of them makes the relay publish those again.
// Duplicates are allowed there; the counter's retry reason counts at least
// every duplicate the receiver holds: each came from a retry after a
// retryable failure. It may count more: a retryable failure that never
// reached the broker (a refused connection) is retried and counted too, as
// the relay cannot tell the two apart. Nothing is lost and every
// aggregate's first copies arrive in commit order.
func TestLostAcknowledgementsCounted(t *testing.T) {
	e := newEnv(t)
	r := newLossyReceiver(t)
	sinkYAML := fmt.Sprintf("  webhook:\n    url: %q\n    secret: %s\n    timeout: 2s", r.srv.URL+"/hooks", e2eWebhookSecret)
	p := e.startSinkRelay("webhook", sinkYAML)
	addr := p.httpAddr()
	var ids []string
	for i := range 20 {
		ids = append(ids, e.insert("outbox", "order", fmt.Sprint(i%4), 15)...)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		distinct, _, _ := r.figures()
		if distinct >= len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages reached the receiver", distinct, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The last lost acknowledgement's retry may still be on its way.
	var counted float64
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, _, lost := r.figures()
		counted = republishedSeries(t, addr)[`{reason="retry",slot="outboxrelay"}`]
		if counted >= float64(lost) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	series := republishedSeries(t, addr)
	p.stop()
	distinct, dups, lost := r.figures()
	r.mu.Lock()
	first := append([]record(nil), r.order...)
	r.mu.Unlock()
	if distinct != len(ids) {
		t.Errorf("receiver holds %d distinct messages, want %d", distinct, len(ids))
	}
	if order := checkOrder(ids, first); order != 0 {
		t.Errorf("%d messages out of their aggregate's order", order)
	}
	if dups == 0 || lost == 0 {
		t.Fatalf("no acknowledgement was lost (%d lost, %d duplicates): the test exercised nothing", lost, dups)
	}
	if counted < float64(dups) {
		t.Errorf("outboxrelay_messages_republished_total{reason=\"retry\"} = %v, below the %d duplicates the receiver holds", counted, dups)
	}
	for labels, v := range series {
		if !strings.Contains(labels, `reason="retry"`) && v != 0 {
			t.Errorf("outboxrelay_messages_republished_total%s = %v, want 0", labels, v)
		}
	}
	total, reasons := statusRepublished(t, e, "outboxrelay")
	if float64(total) != counted || reasons["retry"] != total {
		t.Errorf("status republished_total %d %v, want the metric's %v", total, reasons, counted)
	}
	t.Logf("lost acknowledgements: rows %d, lost 0, acknowledgements lost %d, duplicates %d, republished counted %v (status %d)",
		len(ids), lost, dups, counted, total)
}

// TestKillNineWindowNotCounted: after a kill -9 under load, the slot
// delivers again what the killed relay published past its confirmed
// position. Duplicates are allowed there, and the new process cannot know
// them: its counter stays 0 (no retry happened), and it logs the window it
// found instead. Nothing is lost, and first copies keep their aggregate's
// order.
func TestKillNineWindowNotCounted(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	load := startLoader(t, e.dbURL, "kill", 2*time.Millisecond)
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	time.Sleep(1500 * time.Millisecond)
	p.kill()
	p = e.start()
	addr := p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	ids := load.stop(t)
	recs := c.waitIDs(ids, 90*time.Second)
	series := republishedSeries(t, addr)
	p.stop()
	if order := checkOrder(ids, recs); order != 0 {
		t.Errorf("%d records out of their aggregate's order", order)
	}
	if got := sum(series); got != 0 {
		t.Errorf("outboxrelay_messages_republished_total = %v after a kill -9 with no retry, want 0: the new process cannot know what the killed one published", got)
	}
	out := p.out.String()
	window := strings.Contains(out, `"msg":"an earlier relay published messages past the slot's confirmed position`)
	if !window && !strings.Contains(out, `"msg":"nothing recorded as published past the slot's confirmed position;`) {
		t.Errorf("the restarted relay logged no window past the confirmed position:\n%s", tail(out, 20))
	}
	t.Logf("kill -9: rows %d, lost 0, duplicates %d (allowed, not counted), window logged as non-empty %v", len(ids), duplicates(recs), window)
}
