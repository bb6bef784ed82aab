package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/internal/store"
)

// statusJSON runs `outboxrelay status --json` and decodes the object it
// prints first (an unhealthy status is followed by a line on stderr).
func (e *env) statusJSON(args ...string) (store.Status, int, string) {
	e.t.Helper()
	out, code := e.cli(append([]string{"status", "--database-url", e.dbURL, "--json"}, args...)...)
	var st store.Status
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&st); err != nil {
		e.t.Fatalf("status --json exited %d with output that is not JSON: %v\n%s", code, err, out)
	}
	return st, code, out
}

// TestStatusLagAndView follows the lag of a slot through a stopped relay
// and a catch-up, and checks the SQL view against the command.
func TestStatusLagAndView(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 10)
	c.waitIDs(ids, 30*time.Second)
	p.stop()

	before, code, out := e.statusJSON()
	if code != 0 || !before.Exists || !before.LagKnown() {
		t.Fatalf("status after a clean stop: exit %d\n%s", code, out)
	}
	if before.WALStatus == "" || before.CurrentWALLSN == 0 || before.RestartLSN == 0 || !before.RetainedKnown() {
		t.Errorf("slot figures missing:\n%s", out)
	}
	if before.PublishedTotal != 10 || !slices.Contains(ids, before.LastMessageID) || before.LastPublishedAt.IsZero() || before.LastPublishedLSN == 0 {
		t.Errorf("relay progress after 10 rows:\n%s", out)
	}

	// The relay is stopped: rows pile up behind the slot.
	for range 5 {
		ids = append(ids, e.insert("outbox", "order", "1", 40)...)
	}
	grown, code, out := e.statusJSON()
	if code != 0 {
		t.Fatalf("status with lag and no limit exited %d\n%s", code, out)
	}
	if grown.LagBytes <= before.LagBytes {
		t.Fatalf("lag_bytes did not grow while the relay was stopped: %d then %d", before.LagBytes, grown.LagBytes)
	}
	t.Logf("lag_bytes %d after the first run, %d with 200 rows waiting", before.LagBytes, grown.LagBytes)

	over, code, out := e.statusJSON("--max-lag-bytes", strconv.FormatInt(grown.LagBytes/2, 10))
	if code != 1 || !over.Exists || !strings.Contains(out, "over the limit") {
		t.Errorf("status over --max-lag-bytes: exit %d, want 1 with the object and the reason\n%s", code, out)
	}
	if _, code, out := e.statusJSON("--max-lag-bytes", strconv.FormatInt(grown.LagBytes*4, 10)); code != 0 {
		t.Errorf("status under --max-lag-bytes: exit %d\n%s", code, out)
	}

	p = e.start()
	c.waitIDs(ids, 60*time.Second)
	waitFor(t, 30*time.Second, "checkpoint to count every row", func() bool {
		st, _, _ := e.statusJSON()
		return st.PublishedTotal >= int64(len(ids))
	})
	// lag_bytes counts from restart_lsn too, which moves past the rows once
	// PostgreSQL has written a running-transactions record after them (about
	// every 15 s while WAL is written; a CHECKPOINT writes one at once) and
	// the relay has confirmed past it.
	// An idle relay confirms a position moved only by such records once
	// per heartbeat interval, and a loaded machine may miss one: write
	// another every few seconds until restart_lsn has passed.
	e.exec("CHECKPOINT")
	lastCheckpoint := time.Now()
	waitFor(t, 60*time.Second, "restart_lsn to pass the delivered rows", func() bool {
		if time.Since(lastCheckpoint) > 5*time.Second {
			e.exec("CHECKPOINT")
			lastCheckpoint = time.Now()
		}
		st, _, _ := e.statusJSON()
		return st.LagBytes < grown.LagBytes
	})
	p.stop()

	// The walsender lets go of the slot just after the relay exits.
	var after store.Status
	waitFor(t, 10*time.Second, "the slot to become inactive", func() bool {
		after, code, out = e.statusJSON()
		return code != 0 || !after.Active
	})
	if code != 0 {
		t.Fatalf("status after catching up exited %d\n%s", code, out)
	}
	// Near zero: the final position is confirmed at shutdown; only WAL
	// written after it (the last checkpoint write, other databases) remains.
	if after.LagBytes >= grown.LagBytes || after.LagBytes > 256<<10 {
		t.Errorf("lag_bytes after catching up = %d, want near zero (it was %d)", after.LagBytes, grown.LagBytes)
	}
	if after.PublishedTotal != int64(len(ids)) || !slices.Contains(ids, after.LastMessageID) {
		t.Errorf("published_total %d (want %d), last_message_id %q\n%s", after.PublishedTotal, len(ids), after.LastMessageID, out)
	}
	if after.LastPublishedLSN <= before.LastPublishedLSN || !after.LastPublishedAt.After(before.LastPublishedAt) {
		t.Errorf("last published did not move on: %v at %v, then %v at %v", before.LastPublishedLSN, before.LastPublishedAt, after.LastPublishedLSN, after.LastPublishedAt)
	}

	// The view says the same, for any role.
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	role := "reader_" + strings.TrimPrefix(u.Path, "/")
	e.exec("CREATE ROLE " + role + " LOGIN")
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), e.dbURL); err == nil {
			c.Exec(context.Background(), "DROP OWNED BY "+role)
			c.Exec(context.Background(), "DROP ROLE "+role)
			c.Close(context.Background())
		}
	})
	u.User = url.User(role)
	readerURL := u.String()
	rc, err := pgx.Connect(t.Context(), readerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(context.Background())
	rows, err := rc.Query(t.Context(), "SELECT * FROM outboxrelay.status")
	if err != nil {
		t.Fatalf("SELECT * FROM outboxrelay.status as a plain role: %v", err)
	}
	var cols []string
	for _, f := range rows.FieldDescriptions() {
		cols = append(cols, f.Name)
	}
	views, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	b, _ := json.Marshal(after)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.Token()
	for dec.More() {
		k, _ := dec.Token()
		fields = append(fields, k.(string))
		var skip json.RawMessage
		dec.Decode(&skip)
	}
	if !slices.Equal(cols, fields) {
		t.Errorf("view columns %v\nJSON fields   %v", cols, fields)
	}
	if len(views) != 1 {
		t.Fatalf("view has %d rows, want 1: %v", len(views), views)
	}
	v := views[0]
	if v["slot"] != "outboxrelay" || v["exists"] != true || v["published_total"] != int64(len(ids)) ||
		v["last_message_id"] != after.LastMessageID || v["dead_letters"] != int64(0) {
		t.Errorf("view row %v\ndoes not match status %s", v, b)
	}

	text, code := e.cli("status", "--database-url", e.dbURL)
	if code != 0 {
		t.Fatalf("status exited %d\n%s", code, text)
	}
	t.Logf("outboxrelay status:\n%s", text)
	for _, f := range fields {
		if !regexp.MustCompile(`(?m)^` + f + ` +\S`).MatchString(text) {
			t.Errorf("text output has no %s line:\n%s", f, text)
		}
	}
}

// TestStatusMissingSlot: a missing slot is unhealthy, and still reported.
func TestStatusMissingSlot(t *testing.T) {
	e := newEnv(t)
	st, code, out := e.statusJSON("--slot", "no_such_slot")
	if code != 1 || st.Exists || st.Slot != "no_such_slot" || st.CurrentWALLSN == 0 {
		t.Errorf("missing slot: exit %d, want 1 with exists=false and the server position\n%s", code, out)
	}
	if !strings.Contains(out, `"exists": false`) || !strings.Contains(out, `"lag_bytes": null`) ||
		!strings.Contains(out, `replication slot "no_such_slot" does not exist`) {
		t.Errorf("missing slot output:\n%s", out)
	}
	text, code := e.cli("status", "--database-url", e.dbURL, "--slot", "no_such_slot")
	if code != 1 || !regexp.MustCompile(`(?m)^exists +false$`).MatchString(text) {
		t.Errorf("missing slot, text: exit %d\n%s", code, text)
	}
}

// TestStatusWithoutSchema reports a slot's figures before migrate ran.
func TestStatusWithoutSchema(t *testing.T) {
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	url, err := pg.CreateDatabase(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(t.Context(), "SELECT pg_create_logical_replication_slot('bare', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(context.Background(), "SELECT pg_drop_replication_slot('bare')")
	e := &env{t: t, dbURL: url}
	st, code, out := e.statusJSON("--slot", "bare")
	if code != 0 || !st.Exists || !st.LagKnown() || len(st.Warnings) == 0 || !strings.Contains(out, "outboxrelay migrate") {
		t.Errorf("slot without the outboxrelay schema: exit %d, want 0 with figures and a warning\n%s", code, out)
	}
	text, code := e.cli("status", "--database-url", url, "--slot", "bare")
	if code != 0 || !strings.Contains(text, "warning: schema outboxrelay is missing") {
		t.Errorf("text without schema: exit %d\n%s", code, text)
	}
}

// TestStatusBadUsage: exit 2 with one line, never the password.
func TestStatusBadUsage(t *testing.T) {
	e := &env{t: t}
	out, code := e.cli("status", "--database-url", "postgres://relay:s3cret-pw@127.0.0.1:1/shop?connect_timeout=5")
	if code != 2 || strings.Contains(out, "s3cret-pw") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("unreachable database: exit %d, want 2 with one line and no password\n%s", code, out)
	}
	if out, code := e.cli("status", "--database-url", "postgres://x@127.0.0.1:1/x", "--max-lag-bytes", "lots"); code != 2 {
		t.Errorf("bad flag: exit %d\n%s", code, out)
	}
}

var listenRE = regexp.MustCompile(`"msg":"http listening".*?"addr":"([^"]+)"`)

// httpAddr waits for the relay to log its HTTP address.
func (p *proc) httpAddr() string {
	p.t.Helper()
	p.waitLog(`"http listening"`, 30*time.Second)
	m := listenRE.FindStringSubmatch(p.out.String())
	if m == nil {
		p.t.Fatalf("no address in the http listening line:\n%s", tail(p.out.String(), 20))
	}
	return m[1]
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// metricValues returns the samples of one metric from the text
// exposition format, keyed by their label set.
func metricValues(body, name string) map[string]float64 {
	vals := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		metric, labels, _ := strings.Cut(series, "{")
		if metric != name {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err == nil {
			vals["{"+labels] = v
		}
	}
	return vals
}

func sum(vals map[string]float64) float64 {
	var s float64
	for _, v := range vals {
		s += v
	}
	return s
}

func waitFor(t *testing.T, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMetricsDuringRun scrapes /metrics while the relay publishes.
func TestMetricsDuringRun(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order", "outbox.invoice")
	p := e.start()
	base := "http://" + p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)

	ids := e.insert("outbox", "order", "1", 30)
	ids = append(ids, e.insert("outbox", "invoice", "7", 20)...)
	c.waitIDs(ids, 30*time.Second)

	var body string
	waitFor(t, 10*time.Second, "50 published messages in /metrics", func() bool {
		var code int
		code, body = get(t, base+"/metrics")
		return code == 200 && sum(metricValues(body, "outboxrelay_messages_published_total")) == 50
	})
	published := metricValues(body, "outboxrelay_messages_published_total")
	if published[`{destination="outbox.order",sink="kafka",slot="outboxrelay"}`] != 30 || published[`{destination="outbox.invoice",sink="kafka",slot="outboxrelay"}`] != 20 {
		t.Errorf("messages_published_total by destination: %v", published)
	}
	if n := metricValues(body, "outboxrelay_end_to_end_latency_seconds_count")[`{slot="outboxrelay"}`]; n != 50 {
		t.Errorf("end_to_end_latency_seconds_count = %v, want 50", n)
	}
	if v := metricValues(body, "outboxrelay_end_to_end_latency_seconds_bucket")[`{slot="outboxrelay",le="60"}`]; v != 50 {
		t.Errorf("end_to_end_latency_seconds_bucket{le=60} = %v, want 50", v)
	}
	if v := metricValues(body, "outboxrelay_dead_letters_total"); len(v) != 2 || sum(v) != 0 {
		t.Errorf("dead_letters_total = %v, want two zero series", v)
	}
	for _, name := range []string{"outboxrelay_inflight_messages", "outboxrelay_replication_lag_bytes", "outboxrelay_replication_lag_seconds", "outboxrelay_slot_retained_wal_bytes"} {
		if _, ok := metricValues(body, name)[`{slot="outboxrelay"}`]; !ok {
			t.Errorf("%s{slot=\"outboxrelay\"} missing from /metrics", name)
		}
	}
	if v := metricValues(body, "outboxrelay_role"); v[`{role="active",slot="outboxrelay"}`] != 1 || v[`{role="standby",slot="outboxrelay"}`] != 0 {
		t.Errorf("role = %v, want active", v)
	}
	if v := metricValues(body, "outboxrelay_last_published_timestamp_seconds")[`{slot="outboxrelay"}`]; time.Since(time.Unix(int64(v), 0)) > time.Minute {
		t.Errorf("last_published_timestamp_seconds = %v", v)
	}
	if v := metricValues(body, "outboxrelay_slot_wal_status")[`{slot="outboxrelay",status="reserved"}`]; v != 1 {
		t.Errorf("slot_wal_status{status=reserved} = %v, want 1", v)
	}
	if errs := metricValues(body, "outboxrelay_publish_errors_total"); len(errs) != 2 || sum(errs) != 0 {
		t.Errorf("publish_errors_total = %v, want two zero series", errs)
	}

	if code, b := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d %s while streaming", code, b)
	}
	code, b := get(t, base+"/status")
	var st store.Status
	if err := json.Unmarshal([]byte(b), &st); code != 200 || err != nil || !st.Exists || !st.Active || st.Slot != "outboxrelay" {
		t.Errorf("/status = %d %s", code, b)
	}
	p.stop()

	var total int64
	if err := e.db.QueryRow(t.Context(), "SELECT published_total FROM outboxrelay.status").Scan(&total); err != nil || total != 50 {
		t.Errorf("published_total after the run = %d (%v), want 50", total, err)
	}
}

// TestReadyzSinkDown: /readyz follows the broker and shutdown, /healthz stays 200.
func TestReadyzSinkDown(t *testing.T) {
	e := newEnv(t)
	e.extra = "relay:\n  drain_timeout: 3s\n"
	p := e.start()
	base := "http://" + p.httpAddr()
	waitFor(t, 30*time.Second, "/readyz 200", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == 200
	})
	e.insert("outbox", "order", "1", 1)

	e.kafka.Close()
	// The sink notices the broker is gone when it next talks to it.
	e.insert("outbox", "order", "1", 1)
	var body string
	waitFor(t, 30*time.Second, "/readyz 503 with the broker down", func() bool {
		var code int
		code, body = get(t, base+"/readyz")
		return code == 503
	})
	t.Logf("/readyz with the broker down: %s", strings.TrimSpace(body))
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d while the broker is down, want 200", code)
	}

	// On SIGTERM readiness says so at once, while the relay drains.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitLog(`"shutting down"`, 10*time.Second)
	code, body := get(t, base+"/readyz")
	if code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz during shutdown = %d %q", code, body)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not exit after SIGTERM")
	}
}
