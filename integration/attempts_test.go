package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// relay.max_attempts counts refusals only (issue 42, item 2): the
// retryable failures of an outage use up none of a message's attempts.
// These run the relay binary against a webhook receiver and RabbitMQ, each
// failing a message retryably several times and then refusing it.

// attemptsReceiver answers per aggregate: "refused" 503 six times, then
// 422 for good; "recovers" 503 six times, 422 twice, then 204; any other
// 204. It counts the requests of every message and the 2xx answers.
type attemptsReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests map[string]int // message id -> requests
	got      []delivered    // 2xx answers, repeats kept
}

func newAttemptsReceiver(t *testing.T) *attemptsReceiver {
	r := &attemptsReceiver{requests: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *attemptsReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.WriteHeader(http.StatusNoContent) // the relay's probe at start
		return
	}
	id, agg := req.Header.Get("message_id"), req.Header.Get("aggregate_id")
	var env map[string]any
	if err := json.NewDecoder(req.Body).Decode(&env); err != nil {
		http.Error(w, "not JSON", http.StatusBadRequest) // a refusal: the ledger shows the row lost
		return
	}
	r.mu.Lock()
	r.requests[id]++
	n := r.requests[id]
	ok := agg != "refused" && agg != "recovers" || agg == "recovers" && n > 8
	if ok {
		r.got = append(r.got, delivered{id: id, key: agg, env: env})
	}
	r.mu.Unlock()
	switch {
	case ok:
		w.WriteHeader(http.StatusNoContent)
	case n <= 6:
		http.Error(w, "receiver restarting", http.StatusServiceUnavailable) // no Retry-After: no pause
	default:
		http.Error(w, "unprocessable: aggregate is closed", http.StatusUnprocessableEntity)
	}
}

func (r *attemptsReceiver) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[id]
}

// deadLetterAttempts waits for the dead letter of message id and returns
// the attempts it records.
func (e *env) deadLetterAttempts(id string, timeout time.Duration) int {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var attempts int
		err := e.db.QueryRow(e.t.Context(), `SELECT attempts FROM outboxrelay.dead_letters WHERE message_id = $1`, id).Scan(&attempts)
		if err == nil {
			return attempts
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no dead letter for %s within %s: %v", id, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deadLetteredLog returns the attempts and refusals of the relay's
// "dead-lettered" log line for message id ("" when the field is missing).
func deadLetteredLog(p *proc, id string) (attempts, refusals string) {
	re := regexp.MustCompile(`"msg":"dead-lettered".*"message_id":"` + regexp.QuoteMeta(id) + `".*`)
	line := re.FindString(p.out.String())
	field := func(name string) string {
		m := regexp.MustCompile(`"` + name + `":(\d+)`).FindStringSubmatch(line)
		if m == nil {
			return ""
		}
		return m[1]
	}
	return field("attempts"), field("refusals")
}

// TestMaxAttemptsCountsRefusalsWebhook: with max_attempts 3, a row the
// receiver answers 503 six times and then 422 is dead-lettered at its
// third 422 (nine requests, attempts 9), and a row answered 503 six times
// and 422 twice is delivered on its ninth request. Before the fix both
// were dead-lettered at their first 422 (seven requests).
func TestMaxAttemptsCountsRefusalsWebhook(t *testing.T) {
	e := newEnv(t)
	r := newAttemptsReceiver(t)
	p := e.startSinkRelay("webhook", fmt.Sprintf(`  webhook:
    url: "%s/hooks"
    secret: %s
    timeout: 2s
relay:
  max_attempts: 3`, r.srv.URL, e2eWebhookSecret))
	p.waitLog(`"streaming"`, 30*time.Second)
	refused := e.insert("public.outbox", "order", "refused", 1)[0]
	recovers := e.insert("public.outbox", "order", "recovers", 1)[0]
	plain := e.insert("public.outbox", "order", "plain", 5)

	attempts := e.deadLetterAttempts(refused, 90*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for r.count(recovers) < 9 && time.Now().Before(deadline) {
		if e.hasDeadLetter(recovers) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a request past the dead letter would show here
	p.stop()

	r.mu.Lock()
	defer r.mu.Unlock()
	ids := map[string][]string{"plain": plain, "recovers": {recovers}}
	checkCommitOrder(t, ids, r.got)
	seen, dups := map[string]bool{}, 0
	for _, d := range r.got {
		if seen[d.id] {
			dups++
		}
		seen[d.id] = true
	}
	lost := 0
	for _, list := range ids {
		for _, id := range list {
			if !seen[id] {
				lost++
			}
		}
	}
	logAttempts, logRefusals := deadLetteredLog(p, refused)
	t.Logf("ledger: 7 rows, %d delivered, %d lost, %d duplicates; refused row: %d requests, dead letter attempts %d (log: attempts %s, refusals %s); recovering row: %d requests, dead-lettered %v",
		len(seen), lost, dups, r.requests[refused], attempts, logAttempts, logRefusals, r.requests[recovers], e.hasDeadLetter(recovers))
	if n := r.requests[refused]; n != 9 || attempts != 9 {
		t.Errorf("refused row: %d requests, dead letter records %d attempts; want 9 and 9 (6 × 503, then 3 × 422 under max_attempts 3)", n, attempts)
	}
	if logAttempts != "9" || logRefusals != "3" {
		t.Errorf("dead-lettered log line: attempts %q, refusals %q; want 9 and 3", logAttempts, logRefusals)
	}
	if e.hasDeadLetter(recovers) || !seen[recovers] || r.requests[recovers] != 9 {
		t.Errorf("recovering row: dead-lettered %v, delivered %v after %d requests; want delivered on the 9th (refused twice, under max_attempts 3)",
			e.hasDeadLetter(recovers), seen[recovers], r.requests[recovers])
	}
	if lost != 0 || dups != 0 {
		t.Errorf("%d lost, %d duplicates; want none", lost, dups)
	}
}

func (e *env) hasDeadLetter(id string) bool {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(e.t.Context(), `SELECT count(*) FROM outboxrelay.dead_letters WHERE message_id = $1`, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}

// TestMaxAttemptsCountsRefusalsRabbitMQ: with max_attempts 3, a message
// nacked by a full queue (x-overflow reject-publish) at least four times,
// then unroutable once the queue is deleted, is dead-lettered at its third
// return, and its dead letter records every attempt. Before the fix it was
// dead-lettered at its first return. Rows of another aggregate, routed to
// a queue with room, all arrive meanwhile.
func TestMaxAttemptsCountsRefusalsRabbitMQ(t *testing.T) {
	e := newEnv(t)
	q, env := rabbitEnv(t, "invoice.#")
	full := q.exchange + "-full"
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.QueueDelete(full, false, false, false) })
	if _, err := ch.QueueDeclare(full, false, false, false, false, amqp.Table{"x-max-length": 1, "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(full, "order.#", q.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", full, false, false, amqp.Publishing{Body: []byte("filler")}); err != nil {
		t.Fatal(err)
	}

	p := e.start(append(env, "OUTBOXRELAY_RELAY_MAX_ATTEMPTS=3")...)
	p.waitLog(`"streaming"`, 30*time.Second)
	refused := e.insert("outbox", "order", "1", 1)[0]
	invoices := e.insert("outbox", "invoice", "1", 10)
	retried := regexp.MustCompile(`"msg":"publish failed; retrying".*"message_id":"` + regexp.QuoteMeta(refused) + `".*nacked`)
	deadline := time.Now().Add(60 * time.Second)
	for len(retried.FindAllString(p.out.String(), -1)) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the full queue nacked %s %d times within 60 s, want 4", refused, len(retried.FindAllString(p.out.String(), -1)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := ch.QueueDelete(full, false, false, false); err != nil { // now unroutable: returned, refused for good
		t.Fatal(err)
	}
	attempts := e.deadLetterAttempts(refused, 90*time.Second)
	got := q.waitIDs(invoices, 30*time.Second)
	p.stop()

	nacks := len(retried.FindAllString(p.out.String(), -1))
	returns := len(regexp.MustCompile(`"msg":"publish failed; retrying".*"message_id":"`+regexp.QuoteMeta(refused)+`".*unroutable`).FindAllString(p.out.String(), -1))
	logAttempts, logRefusals := deadLetteredLog(p, refused)
	t.Logf("ledger: 11 rows, 10 invoices delivered, %d duplicates, 0 lost; refused row: %d nacks, %d returns retried, dead letter attempts %d (log: attempts %s, refusals %s)",
		amqpDuplicates(got), nacks, returns, attempts, logAttempts, logRefusals)
	if returns != 2 || attempts != nacks+3 {
		t.Errorf("refused row: %d nacks, %d returns retried, dead letter records %d attempts; want 2 returns retried and %d attempts (dead-lettered at the 3rd return)",
			nacks, returns, attempts, nacks+3)
	}
	if logAttempts != strconv.Itoa(nacks+3) || logRefusals != "3" {
		t.Errorf("dead-lettered log line: attempts %q, refusals %q; want %d and 3", logAttempts, logRefusals, nacks+3)
	}
	if !strings.Contains(e.deadLetterText(refused), "unroutable") {
		t.Errorf("dead letter error %q, want unroutable", e.deadLetterText(refused))
	}
}

func (e *env) deadLetterText(id string) string {
	e.t.Helper()
	var s string
	if err := e.db.QueryRow(e.t.Context(), `SELECT error FROM outboxrelay.dead_letters WHERE message_id = $1`, id).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}
