package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestPipelinesIsolation runs three pipelines in one process, each on its
// own database and Kafka, with a ledger each. Pipeline b loses its broker
// (stopped) and its database role (NOLOGIN, its sessions terminated) while
// rows keep being committed everywhere: a and c deliver every row
// meanwhile, /readyz names b alone, and b delivers every row, none lost,
// once both are back.
func TestPipelinesIsolation(t *testing.T) {
	// Slot names are the server's, not the database's: one each.
	slotted := func(name string) *env { return newEnvWith(t, serverFor(t), "", "--slot", "pipeline_"+name) }
	a, b, c := slotted("a"), slotted("b"), slotted("c")

	// b's broker can be stopped and started again on the same port, with
	// the same data.
	b.kafka.Close()
	port, dir := freePort(t), t.TempDir()
	var bMu sync.Mutex
	var bKafka *kfake.Cluster
	startB := func() {
		cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SyncWrites(),
			kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
		if err != nil {
			t.Fatalf("start b's kfake: %v", err)
		}
		bMu.Lock()
		bKafka = cl
		bMu.Unlock()
	}
	startB()
	t.Cleanup(func() {
		bMu.Lock()
		defer bMu.Unlock()
		if bKafka != nil {
			bKafka.Close()
		}
	})
	b.brokers = fmt.Sprintf("127.0.0.1:%d", port)

	// b's relay connects as a role of its own, which the test locks out.
	role := fmt.Sprintf("pipeline_b_%d_%d", os.Getpid(), dbCounter.Add(1))
	b.exec(fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION SUPERUSER PASSWORD 'b-pass'", role))
	t.Cleanup(func() {
		// t.Context has ended by now; the relay has stopped.
		if _, err := a.db.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	bURL, err := url.Parse(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	bURL.User = url.UserPassword(role, "b-pass")

	cfg := fmt.Sprintf(`postgres:
  status_interval: 200ms
sink:
  type: kafka
http:
  listen: 127.0.0.1:0
pipelines:
  - name: a
    postgres:
      url: %s
      slot: pipeline_a
    sink:
      kafka:
        brokers: [%s]
  - name: b
    postgres:
      url: %s
      slot: pipeline_b
    sink:
      kafka:
        brokers: [%s]
  - name: c
    postgres:
      url: %s
      slot: pipeline_c
    sink:
      kafka:
        brokers: [%s]
`, a.dbURL, a.brokers, bURL.String(), b.brokers, c.dbURL, c.brokers)
	consumers := map[string]*consumer{"a": a.consume("outbox.order"), "c": c.consume("outbox.order")}
	envs := map[string]*env{"a": a, "b": b, "c": c}
	ledger := map[string][]string{}

	p := a.startConfig(cfg)
	base := "http://" + p.httpAddr()
	waitReady(t, base+"/readyz", 200, 60*time.Second)

	write := func(round int) {
		for _, name := range []string{"a", "b", "c"} {
			ledger[name] = append(ledger[name], envs[name].insert("outbox", "order", fmt.Sprintf("%s-%d", name, round%3), 5)...)
		}
	}
	for i := range 4 {
		write(i)
	}
	for _, name := range []string{"a", "c"} {
		consumers[name].waitIDs(ledger[name], 30*time.Second)
	}

	// The fault: b's broker stops, its role is locked out and its sessions
	// (the relay's replication and state connections) end.
	bMu.Lock()
	bKafka.Close()
	bKafka = nil
	bMu.Unlock()
	b.exec("ALTER ROLE " + role + " NOLOGIN")
	var terminated int
	if err := b.db.QueryRow(t.Context(), "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1", role).Scan(&terminated); err != nil {
		t.Fatal(err)
	}
	if terminated < 1 {
		t.Fatalf("terminated %d sessions of %s, want at least the relay's", terminated, role)
	}
	faultAt := len(ledger["a"])
	// /readyz names b, and only b, while a and c answer ready.
	deadline := time.Now().Add(30 * time.Second)
	var body string
	for {
		var code int
		code, body = get(t, base+"/readyz")
		if code == 503 && strings.Contains(body, "b: ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz does not report b within 30s: %d %q", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(body, "a: ") || strings.Contains(body, "c: ") {
		t.Errorf("/readyz blames a healthy pipeline: %q", body)
	}
	for round := 4; round < 24; round++ {
		write(round)
		time.Sleep(100 * time.Millisecond)
	}
	duringFault := len(ledger["a"]) - faultAt
	for _, name := range []string{"a", "c"} {
		consumers[name].waitIDs(ledger[name], 30*time.Second)
		if code, body := get(t, base+"/readyz?pipeline="+name); code != 200 {
			t.Errorf("/readyz?pipeline=%s during b's fault: %d %q", name, code, body)
		}
	}
	if code, body := get(t, base+"/readyz?pipeline=b"); code != 503 {
		t.Errorf("/readyz?pipeline=b during its fault: %d %q", code, body)
	}
	code, status := get(t, base+"/status")
	if code != 200 || !strings.Contains(status, `"name":"b"`) || !strings.Contains(status, `"name":"a","fatal":false,"state":"running"`) {
		t.Errorf("/status during b's fault: %d %s", code, status)
	}
	_, metricsText := get(t, base+"/metrics")
	for _, name := range []string{"a", "c"} {
		if !strings.Contains(metricsText, `outboxrelay_messages_published_total{destination="outbox.order",pipeline="`+name+`"`) {
			t.Errorf("/metrics has no published series for pipeline %s", name)
		}
	}
	if strings.Count(metricsText, "outboxrelay_build_info{") != 1 {
		t.Errorf("/metrics should have one build_info series")
	}

	// The fix: the broker and the role are back.
	startB()
	b.exec("ALTER ROLE " + role + " LOGIN")
	consumers["b"] = b.consume("outbox.order")
	waitReady(t, base+"/readyz", 200, 90*time.Second)
	write(24)
	for name, cons := range consumers {
		recs := cons.waitIDs(ledger[name], 90*time.Second)
		order := checkOrder(ledger[name], recs)
		t.Logf("pipeline %s: rows %d, lost 0, duplicates %d, out of order %d", name, len(ledger[name]), duplicates(recs), order)
		if order != 0 {
			t.Errorf("pipeline %s: %d records out of their aggregate's commit order", name, order)
		}
	}
	p.stop()
	restarts := strings.Count(p.out.String(), "pipeline failed; the others go on")
	t.Logf("b's fault: broker stopped, role locked out, %d sessions terminated, %d restarts of b; a and c delivered %d rows each during it",
		terminated, restarts, duringFault)
	if duringFault < 100 {
		t.Errorf("only %d rows per pipeline were written during the fault", duringFault)
	}
	if restarts < 1 {
		t.Errorf("b was never restarted: the lockout did not stop it")
	}
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "pipeline failed") && !strings.Contains(line, `"pipeline":"b"`) {
			t.Errorf("a pipeline other than b failed: %s", line)
		}
	}
}

// TestPipelinesFatal: a pipeline marked fatal that fails stops the whole
// process, with its error and a non-zero exit, after the others drained;
// the same failure in a pipeline not marked fatal leaves the process
// running and is reported by /readyz.
func TestPipelinesFatal(t *testing.T) {
	a := newEnvWith(t, serverFor(t), "", "--slot", "fatal_a")
	bad := fmt.Sprintf("postgres://nobody@127.0.0.1:%d/none?connect_timeout=2", freePort(t))
	cfg := func(fatal bool) string {
		return fmt.Sprintf(`http:
  listen: 127.0.0.1:0
pipelines:
  - name: a
    postgres:
      url: %s
      slot: fatal_a
    sink:
      kafka:
        brokers: [%s]
  - name: broken
    fatal: %t
    postgres:
      url: %s
    sink:
      kafka:
        brokers: [%s]
`, a.dbURL, a.brokers, fatal, bad, a.brokers)
	}
	p := a.startConfig(cfg(false))
	base := "http://" + p.httpAddr()
	waitReady(t, base+"/readyz?pipeline=a", 200, 30*time.Second)
	p.waitLog("pipeline failed; the others go on", 30*time.Second)
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "broken: failed") || !strings.Contains(body, "1 of 2 pipelines") {
		t.Errorf("/readyz with a broken pipeline: %d %q", code, body)
	}
	ids := a.insert("outbox", "order", "1", 10)
	a.consume("outbox.order").waitIDs(ids, 30*time.Second)
	p.stop()

	out, code := a.cliConfig(cfg(true))
	if code == 0 || !strings.Contains(out, "fatal pipeline failed; stopping every pipeline") || !strings.Contains(out, "pipeline broken") {
		t.Errorf("a fatal pipeline's failure: exit %d\n%s", code, tail(out, 20))
	}
}

// checkOrder counts the records whose message arrived, for the first
// time, before a message committed earlier for the same aggregate.
func checkOrder(committed []string, recs []record) int {
	pos := map[string]int{}
	for i, id := range committed {
		pos[id] = i
	}
	last := map[string]int{}
	seen := map[string]bool{}
	bad := 0
	for _, r := range recs {
		id := r.Headers["message_id"]
		if seen[id] {
			continue
		}
		seen[id] = true
		p, ok := pos[id]
		if !ok {
			continue
		}
		if prev, ok := last[r.Key]; ok && p < prev {
			bad++
		}
		last[r.Key] = p
	}
	return bad
}

// TestPipelinesPauseResume: pausing a pipeline through the management API
// drains it and keeps its slot; rows committed while it is paused are not
// sent until it is resumed, and then every row arrives: 0 lost. Each
// action writes an audit line; one without the action token is refused.
func TestPipelinesPauseResume(t *testing.T) {
	a := newEnvWith(t, serverFor(t), "", "--slot", "pause_a")
	token := filepath.Join(t.TempDir(), "action-token")
	if err := os.WriteFile(token, []byte("act-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`http:
  listen: 127.0.0.1:0
  action_token_file: %s
pipelines:
  - name: a
    postgres:
      url: %s
      slot: pause_a
    sink:
      kafka:
        brokers: [%s]
`, token, a.dbURL, a.brokers)
	p := a.startConfig(cfg)
	base := "http://" + p.httpAddr()
	waitReady(t, base+"/readyz", 200, 30*time.Second)
	cons := a.consume("outbox.order")
	post := func(path, auth string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		req.Header.Set("X-Actor", "test")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var ledger []string
	for i := range 5 {
		ledger = append(ledger, a.insert("outbox", "order", fmt.Sprint(i%2), 20)...)
	}
	if code, body := post("/api/v1/pipelines/a/pause", ""); code != 401 {
		t.Fatalf("pause without the token: %d %s", code, body)
	}
	if code, body := post("/api/v1/pipelines/a/pause", "act-secret"); code != 200 || !strings.Contains(body, `"paused"`) {
		t.Fatalf("pause: %d %s", code, body)
	}
	// Paused means drained: nothing is in flight, so nothing arrives from
	// now on. Rows committed but not yet read stay behind the slot's
	// confirmed position until the resume.
	var exists, active bool
	if err := a.db.QueryRow(t.Context(), "SELECT true, active FROM pg_replication_slots WHERE slot_name = 'pause_a'").Scan(&exists, &active); err != nil || !exists || active {
		t.Fatalf("slot while paused: exists %v active %v (%v)", exists, active, err)
	}
	if code, body := get(t, base+"/readyz?pipeline=a"); code != 503 || !strings.Contains(body, "paused") {
		t.Errorf("/readyz?pipeline=a while paused: %d %q", code, body)
	}
	time.Sleep(500 * time.Millisecond)
	before := len(cons.records())
	atPause := pausedSlot(t, base+"/api/v1/pipelines/a")
	var paused []string
	for i := range 3 {
		paused = append(paused, a.insert("outbox", "order", fmt.Sprint(i%2), 20)...)
	}
	time.Sleep(time.Second)
	if n := len(cons.records()); n != before {
		t.Errorf("%d records arrived while the pipeline was paused", n-before)
	}
	// Paused, the pipeline is read from its database: its slot's lag and
	// retained WAL, which grow with the rows committed meanwhile, and its
	// dead letters.
	later := pausedSlot(t, base+"/api/v1/pipelines/a")
	if atPause.LagBytes != nil && later.LagBytes != nil && *later.LagBytes <= *atPause.LagBytes {
		t.Errorf("lag_bytes while paused: %d after 60 rows, %d at the pause; want it to grow", *later.LagBytes, *atPause.LagBytes)
	}
	if code, body := get(t, base+"/api/v1/pipelines/a/dead-letters"); code != 200 || !strings.Contains(body, `"dead_letters":[]`) {
		t.Errorf("dead letters while paused: %d %s, want 200 and none", code, body)
	}
	var sampled bool
	for deadline := time.Now().Add(12 * time.Second); !sampled && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, body := get(t, base+"/api/v1/history?pipeline=a")
		sampled = strings.Contains(body, `"state":"paused","lag_seconds":`) && !strings.Contains(body, `"state":"paused","lag_seconds":null`)
	}
	if !sampled {
		_, body := get(t, base+"/api/v1/history?pipeline=a")
		t.Errorf("no sample of the paused pipeline has its figures: %s", body)
	}
	if code, body := post("/api/v1/pipelines/a/resume", "act-secret"); code != 200 || !strings.Contains(body, `"running"`) {
		t.Fatalf("resume: %d %s", code, body)
	}
	ledger = append(ledger, paused...)
	cons.waitIDs(ledger, 30*time.Second)
	time.Sleep(500 * time.Millisecond) // a copy would come right behind the first
	recs := cons.records()
	republished := sum(republishedSeries(t, p.httpAddr()))
	p.stop()
	checkOnce(t, "pause and resume", ledger, recs)
	if republished != 0 {
		t.Errorf("outboxrelay_messages_republished_total = %v after a pause and a resume, want 0", republished)
	}
	if total, reasons := statusRepublished(t, a, "pause_a"); total != 0 {
		t.Errorf("status republished_total = %d %v, want 0", total, reasons)
	}
	audits := strings.Count(p.out.String(), `"msg":"audit"`)
	if audits != 3 {
		t.Errorf("%d audit lines, want 3 (refused pause, pause, resume)", audits)
	}
	if order := checkOrder(ledger, recs); order != 0 {
		t.Errorf("%d records out of their aggregate's order", order)
	}
	t.Logf("pause/resume: rows %d (%d committed while paused, %d delivered before the pause), lost 0, duplicates %d, republished %v, audit lines %d",
		len(ledger), len(paused), before, duplicates(recs), republished, audits)
}

// TestPipelinesDeadLetterAPI: the management API lists and shows a
// pipeline's dead letters with their parked chains, replays a head and
// its chain to the broker (refused without the action token), and purges.
func TestPipelinesDeadLetterAPI(t *testing.T) {
	e := newEnvWith(t, serverFor(t), "", "--slot", "billing")
	_, head, chain := e.seedDeadLetters() // the billing slot's: a head and two parked behind it
	token := filepath.Join(t.TempDir(), "action-token")
	if err := os.WriteFile(token, []byte("act-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.startConfig(fmt.Sprintf(`http:
  listen: 127.0.0.1:0
  action_token_file: %s
pipelines:
  - name: billing
    postgres:
      url: %s
      slot: billing
    sink:
      kafka:
        brokers: [%s]
`, token, e.dbURL, e.brokers))
	base := "http://" + p.httpAddr() + "/api/v1/pipelines/billing/dead-letters"
	waitReady(t, "http://"+p.httpAddr()+"/readyz", 200, 30*time.Second)
	cons := e.consume("outbox.order")

	code, body := get(t, base)
	var list struct {
		DeadLetters []struct {
			ID        int64  `json:"id"`
			MessageID string `json:"message_id"`
			Parked    []any  `json:"parked"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list.DeadLetters) != 1 ||
		list.DeadLetters[0].MessageID != head.ID || len(list.DeadLetters[0].Parked) != 2 {
		t.Fatalf("list: %d %v %s", code, err, body)
	}
	id := list.DeadLetters[0].ID
	if code, body := get(t, fmt.Sprintf("%s/%d", base, id)); code != 200 || !strings.Contains(body, head.ID) {
		t.Fatalf("show: %d %s", code, body)
	}
	if code, _ := get(t, base+"/999999"); code != 404 {
		t.Errorf("show of a missing letter: %d", code)
	}
	post := func(url, auth string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	replay := fmt.Sprintf("%s/%d/replay", base, id)
	if code, body := post(replay, "wrong"); code != 401 {
		t.Fatalf("replay with a wrong token: %d %s", code, body)
	}
	if code, body := post(replay, "act-secret"); code != 200 || !strings.Contains(body, `"letters":1,"parked":2`) {
		t.Fatalf("replay: %d %s", code, body)
	}
	want := []string{head.ID, chain[0].ID, chain[1].ID}
	recs := cons.waitIDs(want, 30*time.Second)
	if order := checkOrder(want, recs); order != 0 {
		t.Errorf("the chain arrived out of order (%d)", order)
	}
	if code, body := post(base+"/purge", "act-secret"); code != 400 {
		t.Errorf("purge without before: %d %s", code, body)
	}
	before := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	if code, body := post(base+"/purge?before="+before, "act-secret"); code != 200 || !strings.Contains(body, `"letters":1`) {
		t.Errorf("purge: %d %s", code, body)
	}
	if code, body := get(t, base+"?all=true"); code != 200 || !strings.Contains(body, `"dead_letters":[]`) {
		t.Errorf("list after the purge: %d %s", code, body)
	}
	p.stop()
	audits := strings.Count(p.out.String(), `"msg":"audit"`)
	if audits != 4 {
		t.Errorf("%d audit lines, want 4", audits)
	}
	t.Logf("dead letter API: replayed 1 head and 2 parked, %d records at the broker (duplicates %d), purged 1, audit lines %d", len(recs), duplicates(recs), audits)
}

// TestPipelinesVerifyAPI: verify over a window through the management
// API agrees with the ledger: every delivered row found, then a row
// committed while the pipeline is paused reported missing by id; a bad
// window and a missing token are refused.
func TestPipelinesVerifyAPI(t *testing.T) {
	e := newEnvWith(t, serverFor(t), "", "--slot", "verify_api")
	token := filepath.Join(t.TempDir(), "action-token")
	if err := os.WriteFile(token, []byte("act-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.startConfig(fmt.Sprintf(`http:
  listen: 127.0.0.1:0
  action_token_file: %s
pipelines:
  - name: v
    postgres:
      url: %s
      slot: verify_api
    sink:
      kafka:
        brokers: [%s]
`, token, e.dbURL, e.brokers))
	base := "http://" + p.httpAddr() + "/api/v1/pipelines/v"
	waitReady(t, "http://"+p.httpAddr()+"/readyz", 200, 30*time.Second)
	cons := e.consume("outbox.order")
	since := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	post := func(path, auth string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	var ledger []string
	for i := range 3 {
		ledger = append(ledger, e.insert("outbox", "order", fmt.Sprint(i), 10)...)
	}
	cons.waitIDs(ledger, 30*time.Second)

	verify := func() VerifyAnswer {
		t.Helper()
		code, body := post("/verify?margin=0s&since="+url.QueryEscape(since), "act-secret")
		var v VerifyAnswer
		if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
			t.Fatalf("verify: %d %v %s", code, err, body)
		}
		return v
	}
	if code, body := post("/verify?since="+url.QueryEscape(since), ""); code != 401 {
		t.Errorf("verify without the token: %d %s", code, body)
	}
	if code, body := post("/verify", "act-secret"); code != 400 || !strings.Contains(body, "since is required") {
		t.Errorf("verify without since: %d %s", code, body)
	}
	if code, body := post("/verify?since=yesterday", "act-secret"); code != 400 {
		t.Errorf("verify with since=yesterday: %d %s", code, body)
	}
	if v := verify(); !v.OK || v.Committed != int64(len(ledger)) || v.Found != int64(len(ledger)) || v.Missing != 0 {
		t.Fatalf("verify after delivery: %+v, want %d committed and found, 0 missing", v, len(ledger))
	}

	if code, body := post("/pause", "act-secret"); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	held := e.insert("outbox", "order", "held", 1)
	v := verify()
	if v.OK || v.Missing != 1 || len(v.MissingIDs) != 1 || v.MissingIDs[0] != held[0] {
		t.Errorf("verify with a row committed while paused: %+v, want that row (%s) missing", v, held[0])
	}
	if code, body := post("/resume", "act-secret"); code != 200 {
		t.Fatalf("resume: %d %s", code, body)
	}
	cons.waitIDs(append(ledger, held...), 30*time.Second)
	p.stop()
	t.Logf("verify API: %d rows found, then 1 row committed while paused reported missing (%s)", len(ledger), held[0])
}

// VerifyAnswer is the part of the verify action's answer the test reads.
type VerifyAnswer struct {
	OK         bool     `json:"ok"`
	Committed  int64    `json:"committed"`
	Found      int64    `json:"found"`
	Missing    int64    `json:"missing"`
	MissingIDs []string `json:"missing_ids"`
}

// pausedSlot is the slot's figures in GET url (a paused pipeline): lag and
// retained WAL must be known.
func pausedSlot(t *testing.T, url string) (slot struct {
	LagBytes         *int64   `json:"lag_bytes"`
	LagSeconds       *float64 `json:"lag_seconds"`
	RetainedWALBytes *int64   `json:"retained_wal_bytes"`
	PublishedTotal   int64    `json:"published_total"`
}) {
	t.Helper()
	code, body := get(t, url)
	var st struct {
		State       string          `json:"state"`
		StatusError string          `json:"status_error"`
		Slot        json.RawMessage `json:"slot"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != 200 || st.State != "paused" {
		t.Fatalf("GET %s: %d %v %s", url, code, err, body)
	}
	if st.Slot != nil {
		if err := json.Unmarshal(st.Slot, &slot); err != nil {
			t.Fatalf("slot of %s: %v", body, err)
		}
	}
	if slot.LagBytes == nil || slot.LagSeconds == nil || slot.RetainedWALBytes == nil {
		t.Errorf("a paused pipeline's slot lacks its lag or retained WAL: %s", body)
	} else {
		t.Logf("paused: lag %.1f s / %d bytes, retained WAL %d bytes, published %d", *slot.LagSeconds, *slot.LagBytes, *slot.RetainedWALBytes, slot.PublishedTotal)
	}
	return slot
}
