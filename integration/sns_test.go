package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/sinks/sns/goawstest"
)

// The sns sink end to end through the relay binary, against goaws behind
// a fault-injecting proxy: about 30% of the requests fail (500 before
// goaws sees them, 502 after goaws published them, a hang past the sink's
// timeout), the relay is killed with SIGKILL mid-way, and the proxy
// refuses one aggregate's messages as SNS refuses bad parameters (400
// InvalidParameter).

type snsProxy struct {
	mu       sync.Mutex
	requests int
	faults   map[string]int
	refused  int
	quit     chan struct{}
}

func (p *snsProxy) handler(target string) http.Handler {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		form, _ := url.ParseQuery(string(body))
		r.Body = io.NopCloser(bytes.NewReader(body))
		if form.Get("Action") != "Publish" {
			rp.ServeHTTP(w, r)
			return
		}
		refused := false
		for i := 1; form.Get(fmt.Sprintf("MessageAttributes.entry.%d.Name", i)) != ""; i++ {
			if form.Get(fmt.Sprintf("MessageAttributes.entry.%d.Name", i)) == "aggregate_id" && form.Get(fmt.Sprintf("MessageAttributes.entry.%d.Value.StringValue", i)) == "refused" {
				refused = true
			}
		}
		p.mu.Lock()
		p.requests++
		n := p.requests
		fault := ""
		switch {
		case refused:
			p.refused++
		case n%10 == 3 || n%10 == 7:
			fault = "500"
		case n%10 == 5:
			fault = "502-after"
		case n%20 == 9:
			fault = "hang"
		}
		if fault != "" {
			p.faults[fault]++
		}
		p.mu.Unlock()
		switch {
		case refused:
			w.Header().Set("Content-Type", "text/xml")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><Error><Type>Sender</Type><Code>InvalidParameter</Code><Message>aggregate refused is closed</Message></Error><RequestId>proxy</RequestId></ErrorResponse>`)
		case fault == "500":
			http.Error(w, "injected", http.StatusInternalServerError)
		case fault == "502-after":
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r) // goaws publishes; the answer is lost
			http.Error(w, "injected after publishing", http.StatusBadGateway)
		case fault == "hang":
			select {
			case <-time.After(3 * time.Second):
			case <-p.quit:
			}
		default:
			rp.ServeHTTP(w, r)
		}
	})
}

func TestSNSEndToEnd(t *testing.T) {
	e := newEnv(t)
	srv := goawstest.Start(t)
	queue := srv.Subscribe(t, "orders")
	px := &snsProxy{faults: map[string]int{}, quit: make(chan struct{})}
	front := httptest.NewServer(px.handler(srv.URL))
	t.Cleanup(func() { close(px.quit); front.Close() })

	r := &queueReader{seen: map[string]bool{}}
	stop := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ms, err := srv.Receive(queue)
			if err != nil || len(ms) == 0 {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			for _, m := range ms {
				var env map[string]any
				_ = json.Unmarshal([]byte(m.Body), &env)
				id := m.Attributes["message_id"]
				r.mu.Lock()
				if r.seen[id] {
					r.dups++
				}
				r.seen[id] = true
				r.got = append(r.got, delivered{id: id, key: m.Attributes["aggregate_id"], env: env})
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-readDone })

	sinkYAML := fmt.Sprintf(`  sns:
    topic_arn: %s
    endpoint: %s
    region: %s
    access_key_id: test
    secret_access_key: test
    batch_size: 1
    timeout: 1s
relay:
  max_attempts: 2`, goawstest.TopicARN("orders"), front.URL, goawstest.Region)

	ids := map[string][]string{}
	aggs := []string{"1", "2", "3", "4", "5", "6"}
	var refused []string
	insert := func(rounds int) {
		for range rounds {
			for _, agg := range aggs {
				ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, 20)...)
			}
			refused = append(refused, e.insert("public.outbox", "order", "refused", 2)...)
		}
	}
	p := e.startSinkRelay("sns", sinkYAML)
	insert(2)
	r.waitDelivered(t, 100, 2*time.Minute)
	p.kill()
	if atKill, first := r.delivered(), 2*20*len(aggs); atKill >= first {
		t.Errorf("the kill came after all %d rows of the first run were delivered (%d): it tested no crash mid-way", first, atKill)
	}
	insert(2)
	want := 0
	for _, list := range ids {
		want += len(list)
	}
	p = e.startSinkRelay("sns", sinkYAML)
	r.waitDelivered(t, want, 2*time.Minute)

	var letters, parked, withReason int
	deadline := time.Now().Add(30 * time.Second)
	for {
		e.db.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE error LIKE '%InvalidParameter: aggregate refused is closed%')
			FROM outboxrelay.dead_letters WHERE aggregate_id = 'refused'`).Scan(&letters, &withReason)
		e.db.QueryRow(t.Context(), `SELECT count(DISTINCT message_id) FROM outboxrelay.parked WHERE aggregate_id = 'refused'`).Scan(&parked)
		if letters+parked >= len(refused) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.stop()

	verifyCfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\nsink:\n  type: sns\n%s\n", e.dbURL, sinkYAML))
	if out, code := e.cli("verify", "--config", verifyCfg, "--since", "1h"); code != 2 || !strings.Contains(out, "an SNS topic keeps no messages") {
		t.Errorf("verify with the sns sink: exit %d, %s; want exit 2 and the refusal", code, out)
	}

	px.mu.Lock()
	defer px.mu.Unlock()
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
			t.Errorf("refused message %s was delivered", id)
		}
	}
	nFaults := px.faults["500"] + px.faults["502-after"] + px.faults["hang"]
	t.Logf("ledger: %d rows committed (%d to deliver, %d refused), 1 kill -9, %d Publish requests, faults %v (%.0f%%), %d refused; %d lost, %d duplicates at the subscriber; %d dead letters (%d with the reason), %d parked",
		want+len(refused), want, len(refused), px.requests, px.faults, 100*float64(nFaults)/float64(px.requests), px.refused, lost, r.dups, letters, withReason, parked)
	if lost != 0 {
		t.Errorf("%d messages lost", lost)
	}
	if letters < 1 || withReason != letters || letters+parked != len(refused) {
		t.Errorf("refused aggregate: %d dead letters (%d with the reason) and %d parked, want %d in all", letters, withReason, parked, len(refused))
	}
	if px.faults["500"] < 20 || px.faults["502-after"] < 10 || px.faults["hang"] < 3 {
		t.Errorf("faults injected %v, want at least 20 500s, 10 502s after publishing and 3 hangs", px.faults)
	}
}
