package webhook

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

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// batchReceiver accepts batch POSTs (a JSON array of envelopes), checks
// each request's signature, fails every third batch with 503 and refuses
// with 422 any batch holding a message of aggregate "bad", which the sink
// must then split.
type batchReceiver struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs int
	// sizes of the 2xx batches; got: the ids they held, in arrival order
	sizes []int
	got   []string
	aggOf map[string]string
	bad   []string
}

func (r *batchReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs++
	if err := checkSignature(req.Header, body); err != nil {
		r.bad = append(r.bad, err.Error())
	}
	var batch []map[string]string
	if strings.HasPrefix(string(body), "[") {
		if err := json.Unmarshal(body, &batch); err != nil {
			r.bad = append(r.bad, err.Error())
		}
		if !strings.HasPrefix(req.Header.Get(HeaderWebhookID), "batch_") || req.Header.Get("Content-Type") != "application/json" {
			r.bad = append(r.bad, fmt.Sprintf("batch headers %v", req.Header))
		}
	} else {
		var one map[string]string
		_ = json.Unmarshal(body, &one)
		batch = append(batch, one)
	}
	for _, e := range batch {
		if e["aggregate_id"] == "bad" {
			http.Error(w, "aggregate bad is closed", http.StatusUnprocessableEntity)
			return
		}
	}
	if len(batch) > 1 && r.reqs%3 == 0 {
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	r.sizes = append(r.sizes, len(batch))
	for _, e := range batch {
		r.got = append(r.got, e["message_id"])
		r.aggOf[e["message_id"]] = e["aggregate_id"]
	}
	w.WriteHeader(http.StatusNoContent)
}

// TestBatchMode: many messages per POST, one per aggregate; a retryable
// answer fails the whole batch (the test republishes as the relay does),
// a permanent one splits it so that only the refused message is
// dead-lettered; per-aggregate order holds and nothing is lost.
func TestBatchMode(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	r := &batchReceiver{aggOf: map[string]string{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	defer r.srv.Close()
	s := newSink(t, Config{URL: r.srv.URL + "/hooks", Batch: Batch{MaxMessages: 20, Linger: 20 * time.Millisecond}})
	sinktest.RunSink(t, s)

	msgs := sinktest.Messages("batch", 600, 30)
	for _, m := range msgs {
		m.Envelope = fmt.Appendf(nil, `{"message_id":%q,"aggregate_id":%q}`, m.ID, m.AggregateID)
	}
	bad := msgs[5]
	bad.AggregateID = "bad"
	bad.Envelope = fmt.Appendf(nil, `{"message_id":%q,"aggregate_id":"bad"}`, bad.ID)

	// As the relay does: one message of an aggregate at the sink at a
	// time, a retryable failure published again.
	byAgg := map[string][]*relay.Message{}
	for _, m := range msgs {
		byAgg[m.AggregateID] = append(byAgg[m.AggregateID], m)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	retries := 0
	var refused error
	for _, list := range byAgg {
		wg.Go(func() {
			for _, m := range list {
				for attempt := 0; attempt < 50; attempt++ {
					out := make(chan error, 1)
					s.Publish(t.Context(), m, func(_ *relay.Message, err error) { out <- err })
					err := <-out
					if err == nil {
						break
					}
					if !relay.Retryable(err) {
						mu.Lock()
						refused = err
						mu.Unlock()
						if m != bad {
							t.Errorf("message %s: permanent %v", m.ID, err)
						}
						break
					}
					mu.Lock()
					retries++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bad {
		t.Error(b)
	}
	if refused == nil || !strings.Contains(refused.Error(), "422") || !strings.Contains(refused.Error(), "aggregate bad is closed") {
		t.Errorf("refused message: %v, want the 422 and its answer", refused)
	}
	pos := map[string]int{}
	for i, m := range msgs {
		pos[m.ID] = i
	}
	seen, last := map[string]bool{}, map[string]int{}
	for _, id := range r.got {
		if seen[id] {
			continue
		}
		seen[id] = true
		agg := r.aggOf[id]
		if p, ok := last[agg]; ok && p > pos[id] {
			t.Errorf("aggregate %s: message #%d after #%d", agg, pos[id], p)
		}
		last[agg] = pos[id]
	}
	if len(seen) != len(msgs)-1 || seen[bad.ID] {
		t.Errorf("%d delivered (refused one among them: %v), want %d", len(seen), seen[bad.ID], len(msgs)-1)
	}
	most := 0
	for _, n := range r.sizes {
		most = max(most, n)
	}
	t.Logf("%d requests, %d delivered batches (largest %d), %d retries", r.reqs, len(r.sizes), most, retries)
	if most < 5 || retries == 0 {
		t.Errorf("largest batch %d, %d retries: batching or the 503s were not exercised", most, retries)
	}
}

func TestBatchFormatRefused(t *testing.T) {
	c := &Config{Batch: Batch{MaxMessages: 10}}
	if err := c.CheckFormat(relay.FormatDebezium); err == nil || !strings.Contains(err.Error(), "sink.webhook.batch.max_messages") {
		t.Errorf("debezium with batches: %v", err)
	}
	if err := c.CheckFormat(relay.FormatCloudEvents); err != nil {
		t.Error(err)
	}
}

// TestBatchFormsWithDefaultConns: with max_conns_per_host at its default
// (16) and fewer aggregates than that, batches still form, and no POST
// waits out batch.linger while no answer could bring more messages.
// Before, each of the 16 workers took one ready message and lingered for
// more that the others had taken: 300 rows over 8 aggregates went in 300
// POSTs of one message, each after the full linger.
func TestBatchFormsWithDefaultConns(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	for _, linger := range []time.Duration{0, time.Second} { // 0: the default
		t.Run(fmt.Sprint("linger ", linger), func(t *testing.T) { testBatchForms(t, linger) })
	}
}

func testBatchForms(t *testing.T, linger time.Duration) {
	r := &batchReceiver{aggOf: map[string]string{}}
	arrived := map[string]time.Time{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		now := time.Now()
		r.serve(w, req)
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, id := range r.got {
			if _, ok := arrived[id]; !ok {
				arrived[id] = now
			}
		}
	}))
	defer r.srv.Close()
	s := newSink(t, Config{URL: r.srv.URL + "/hooks", Batch: Batch{MaxMessages: 50, Linger: linger}})
	if s.cfg.MaxConnsPerHost != DefaultMaxConnsPerHost {
		t.Fatalf("max_conns_per_host %d, want the default %d", s.cfg.MaxConnsPerHost, DefaultMaxConnsPerHost)
	}
	sinktest.RunSink(t, s)

	msgs := sinktest.Messages("batch", 300, 8)
	for _, m := range msgs {
		m.Envelope = fmt.Appendf(nil, `{"message_id":%q,"aggregate_id":%q}`, m.ID, m.AggregateID)
	}
	byAgg := map[string][]*relay.Message{}
	for _, m := range msgs {
		byAgg[m.AggregateID] = append(byAgg[m.AggregateID], m)
	}
	var mu sync.Mutex
	published := map[string]time.Time{}
	var wg sync.WaitGroup
	for _, list := range byAgg { // as the relay does: one message of an aggregate at a time, a retryable failure sent again
		wg.Go(func() {
			for _, m := range list {
				for attempt := 0; attempt < 50; attempt++ {
					mu.Lock()
					published[m.ID] = time.Now()
					mu.Unlock()
					out := make(chan error, 1)
					s.Publish(t.Context(), m, func(_ *relay.Message, err error) { out <- err })
					err := <-out
					if err == nil {
						break
					}
					if !relay.Retryable(err) {
						t.Errorf("message %s: permanent %v", m.ID, err)
						break
					}
				}
			}
		})
	}
	wg.Wait()

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bad {
		t.Error(b)
	}
	pos := map[string]int{}
	for i, m := range msgs {
		pos[m.ID] = i
	}
	seen, last := map[string]bool{}, map[string]int{}
	outOfOrder := 0
	for _, id := range r.got {
		if seen[id] {
			continue
		}
		seen[id] = true
		agg := r.aggOf[id]
		if p, ok := last[agg]; ok && p > pos[id] {
			outOfOrder++
		}
		last[agg] = pos[id]
	}
	waited := 0
	for id, at := range arrived {
		if at.Sub(published[id]) >= s.cfg.Batch.Linger {
			waited++
		}
	}
	lost := len(msgs) - len(seen)
	t.Logf("rows %d over 8 aggregates: %d POSTs (%d answered 2xx, sizes %v), lost %d, out of order %d, waited out the linger %d",
		len(msgs), r.reqs, len(r.sizes), r.sizes, lost, outOfOrder, waited)
	if lost != 0 || outOfOrder != 0 {
		t.Errorf("%d lost, %d out of order", lost, outOfOrder)
	}
	if r.reqs > len(msgs)/4 {
		t.Errorf("%d POSTs for %d messages over 8 aggregates: batches did not form", r.reqs, len(msgs))
	}
	// Under the default linger (5ms) a request's own time and the
	// machine's load are of its size, so only a long one tells.
	if linger >= time.Second && waited != 0 {
		t.Errorf("%d messages waited out batch.linger (%v) before their POST", waited, s.cfg.Batch.Linger)
	}
}
