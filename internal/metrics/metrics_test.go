package metrics

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gather returns the metrics of family name, failing when it is missing.
func gather(t *testing.T, m *Metrics, name string) []*dto.Metric {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func TestHooks(t *testing.T) {
	inflight := 7
	m := New(Config{Sink: "kafka", InFlight: func() int { return inflight }})
	h := m.Hooks()
	commit := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	for i, d := range []time.Duration{3 * time.Millisecond, 40 * time.Millisecond, 2 * time.Second} {
		dest := "outbox.order"
		if i == 2 {
			dest = "outbox.invoice"
		}
		h.Published(&relay.Message{Destination: dest, CommitTime: commit}, commit.Add(d))
	}
	// A database clock ahead of ours must not give negative latencies.
	h.Published(&relay.Message{Destination: "outbox.order", CommitTime: commit}, commit.Add(-time.Second))
	h.PublishFailed(&relay.Message{}, errors.New("broker not available"))
	h.PublishFailed(&relay.Message{}, relay.Permanent(errors.New("message too large")))
	h.PublishFailed(&relay.Message{}, relay.Permanent(errors.New("message too large")))
	h.DeadLettered(&relay.Message{LastError: relay.Permanent(errors.New("message too large"))})
	h.DeadLettered(&relay.Message{LastError: errors.New("invalid outbox message: no id")})
	h.DeadLettered(&relay.Message{LastError: relay.Permanent(errors.New("unroutable"))})

	got := map[string]float64{}
	for _, mt := range gather(t, m, "outboxrelay_messages_published_total") {
		l := labels(mt)
		if l["sink"] != "kafka" {
			t.Errorf("sink label = %q", l["sink"])
		}
		got[l["destination"]] = mt.GetCounter().GetValue()
	}
	if got["outbox.order"] != 3 || got["outbox.invoice"] != 1 {
		t.Errorf("messages_published_total = %v", got)
	}
	errs := map[string]float64{}
	for _, mt := range gather(t, m, "outboxrelay_publish_errors_total") {
		errs[labels(mt)["reason"]] = mt.GetCounter().GetValue()
	}
	if errs["retryable"] != 1 || errs["permanent"] != 2 || len(errs) != 2 {
		t.Errorf("publish_errors_total = %v", errs)
	}
	dead := map[string]float64{}
	for _, mt := range gather(t, m, "outboxrelay_dead_letters_total") {
		dead[labels(mt)["reason"]] = mt.GetCounter().GetValue()
	}
	if dead["permanent"] != 2 || dead["invalid"] != 1 || len(dead) != 2 {
		t.Errorf("dead_letters_total = %v", dead)
	}
	hist := gather(t, m, "outboxrelay_end_to_end_latency_seconds")[0].GetHistogram()
	if hist.GetSampleCount() != 4 || hist.GetSampleSum() < 2.04 || hist.GetSampleSum() > 2.05 {
		t.Errorf("latency count %d sum %v, want 4 and 2.043", hist.GetSampleCount(), hist.GetSampleSum())
	}
	for _, b := range hist.GetBucket() {
		want := map[float64]uint64{0.001: 1, 0.0025: 1, 0.005: 2, 0.05: 3, 1: 3, 2.5: 4, 60: 4}
		if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
			t.Errorf("bucket le=%v has %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
	if v := gather(t, m, "outboxrelay_inflight_messages")[0].GetGauge().GetValue(); v != 7 {
		t.Errorf("inflight_messages = %v", v)
	}
	// The newest acknowledgement wins even when an older one is reported later.
	if v := gather(t, m, "outboxrelay_last_published_timestamp_seconds")[0].GetGauge().GetValue(); v != float64(commit.Add(2*time.Second).Unix()) {
		t.Errorf("last_published_timestamp_seconds = %v", v)
	}
}

func TestHandler(t *testing.T) {
	m := New(Config{Sink: "rabbitmq", Slot: "orders", Version: "1.4.0", Revision: "5424825",
		Destinations: []string{"outbox"}, IgnoredTables: []string{"public.audit"}})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`outboxrelay_publish_errors_total{reason="permanent",sink="rabbitmq",slot="orders"} 0`,
		`outboxrelay_messages_published_total{destination="outbox",sink="rabbitmq",slot="orders"} 0`,
		`outboxrelay_skipped_inserts_total{slot="orders",table="public.audit"} 0`,
		`outboxrelay_dead_letters_total{reason="invalid",slot="orders"} 0`,
		`outboxrelay_dead_letters_total{reason="permanent",slot="orders"} 0`,
		`outboxrelay_replication_lag_bytes{slot="orders"} 0`,
		`outboxrelay_replication_lag_seconds{slot="orders"} `,
		`outboxrelay_slot_retained_wal_bytes{slot="orders"} 0`,
		`outboxrelay_max_slot_wal_keep_size_bytes{slot="orders"} -1`,
		`outboxrelay_slot_wal_status{slot="orders",status="lost"} 0`,
		`outboxrelay_build_info{revision="5424825",version="1.4.0"} 1`,
		`outboxrelay_role{role="active",slot="orders"} 1`,
		`outboxrelay_role{role="standby",slot="orders"} 0`,
		`outboxrelay_inflight_messages{slot="orders"} 0`,
		`outboxrelay_end_to_end_latency_seconds_bucket{slot="orders",le="0.001"} 0`,
		"go_goroutines",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
}

func TestRunPollsSlot(t *testing.T) {
	var calls atomic.Int32
	m := New(Config{PollInterval: 10 * time.Millisecond, Status: func(ctx context.Context) (store.Status, error) {
		switch calls.Add(1) {
		case 1:
			return store.Status{Exists: true, WALStatus: "reserved", ConfirmedFlushLSN: 0x100, CurrentWALLSN: 0x1100, LagBytes: 4096}, nil
		case 2:
			return store.Status{}, errors.New("connection refused")
		default:
			// Lag unknown: the last known value stays.
			return store.Status{Exists: true, WALStatus: "unreserved"}, nil
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	for calls.Load() < 4 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := gather(t, m, "outboxrelay_replication_lag_bytes")[0].GetGauge().GetValue(); v != 4096 {
		t.Errorf("replication_lag_bytes = %v", v)
	}
	ws := map[string]float64{}
	for _, mt := range gather(t, m, "outboxrelay_slot_wal_status") {
		ws[labels(mt)["status"]] = mt.GetGauge().GetValue()
	}
	if len(ws) != 4 || ws["unreserved"] != 1 || ws["reserved"] != 0 || ws["lost"] != 0 {
		t.Errorf("slot_wal_status = %v", ws)
	}
}

func TestLagSeconds(t *testing.T) {
	var since atomic.Pointer[time.Time]
	zero := time.Time{}
	since.Store(&zero)
	var standby atomic.Bool
	m := New(Config{
		LagSince: func() time.Time { return *since.Load() },
		Standby:  standby.Load,
	})
	lag := func() float64 { return gather(t, m, "outboxrelay_replication_lag_seconds")[0].GetGauge().GetValue() }

	// Nothing known yet: the time since start, so that a relay stuck from
	// the start still shows a growing lag.
	if v := lag(); v < 0 || v > 5 {
		t.Errorf("before anything is known: lag_seconds = %v, want the seconds since New", v)
	}
	// PostgreSQL's figure, aged since it was read.
	m.observeSlot(store.Status{Exists: true, LagSeconds: 120, LagSince: time.Now().Add(-120 * time.Second)})
	if v := lag(); v < 120 || v > 125 {
		t.Errorf("from the status poll: lag_seconds = %v, want about 120", v)
	}
	// The relay's own figure wins.
	s := time.Now().Add(-3 * time.Second)
	since.Store(&s)
	if v := lag(); v < 3 || v > 8 {
		t.Errorf("from the relay: lag_seconds = %v, want about 3", v)
	}
	// A database clock ahead of ours never gives a negative lag.
	s2 := time.Now().Add(time.Minute)
	since.Store(&s2)
	if v := lag(); v != 0 {
		t.Errorf("commit time in the future: lag_seconds = %v, want 0", v)
	}

	role := func() map[string]float64 {
		r := map[string]float64{}
		for _, mt := range gather(t, m, "outboxrelay_role") {
			r[labels(mt)["role"]] = mt.GetGauge().GetValue()
		}
		return r
	}
	if r := role(); r["active"] != 1 || r["standby"] != 0 {
		t.Errorf("role of an active relay: %v", r)
	}
	standby.Store(true)
	if r := role(); r["active"] != 0 || r["standby"] != 1 {
		t.Errorf("role of a standby: %v", r)
	}
	// A relay that lost the slot to another keeps its last figure, which
	// stands still: the standby reports PostgreSQL's instead.
	old := time.Now().Add(-time.Hour)
	since.Store(&old)
	m.observeSlot(store.Status{Exists: true, LagSeconds: 2, LagSince: time.Now().Add(-2 * time.Second)})
	if v := lag(); v < 2 || v > 7 {
		t.Errorf("standby: lag_seconds = %v, want PostgreSQL's 2, not its own stale hour", v)
	}
}

// TestReservedHeadersDropped: every reserved name and prefix has a series
// from the start, and the hook counts under the label it is given.
func TestReservedHeadersDropped(t *testing.T) {
	m := New(Config{Sink: "kafka"})
	h := m.Hooks()
	h.ReservedHeaderDropped(&relay.Message{ID: "a"}, "message_id")
	h.ReservedHeaderDropped(&relay.Message{ID: "a"}, "ce_*")
	h.ReservedHeaderDropped(&relay.Message{ID: "b"}, "ce_*")
	got := map[string]float64{}
	for _, mt := range gather(t, m, "outboxrelay_reserved_headers_dropped_total") {
		got[labels(mt)["header"]] = mt.GetCounter().GetValue()
	}
	if got["message_id"] != 1 || got["ce_*"] != 2 || len(got) != len(envelope.ReservedForms()) {
		t.Errorf("reserved_headers_dropped_total = %v", got)
	}
	if v, ok := got["id"]; !ok || v != 0 {
		t.Errorf("no zero series for id: %v", got)
	}
}

// TestRepublished: every reason has a series from the start at 0, and the
// hook counts under the reason it is given.
func TestRepublished(t *testing.T) {
	m := New(Config{Sink: "kafka"})
	got := func() map[string]float64 {
		v := map[string]float64{}
		for _, mt := range gather(t, m, "outboxrelay_messages_republished_total") {
			v[labels(mt)["reason"]] = mt.GetCounter().GetValue()
		}
		return v
	}
	if v := got(); len(v) != len(relay.RepublishedReasons) || v[relay.RepublishedRetry] != 0 {
		t.Errorf("a clean start: messages_republished_total = %v, want a 0 series per reason %v", v, relay.RepublishedReasons)
	}
	h := m.Hooks()
	h.Republished(&relay.Message{ID: "a"}, relay.RepublishedRetry)
	h.Republished(&relay.Message{ID: "a"}, relay.RepublishedRetry)
	if v := got(); v[relay.RepublishedRetry] != 2 || v[relay.RepublishedReplay] != 0 {
		t.Errorf("messages_republished_total = %v, want retry 2", v)
	}
}

// TestInvalidUTF8Labels: a destination or table that is not valid UTF-8
// reaches no label as it is (client_golang panics on one, after the broker
// acknowledged the message): the hooks count it under the value with U+FFFD,
// and the registry still gathers.
func TestInvalidUTF8Labels(t *testing.T) {
	// The configuration's names come from the environment too, which
	// may hold any bytes.
	m := New(Config{Sink: "nats", Destinations: []string{"outbox.caf\xe9"}, IgnoredTables: []string{"public.caf\xe9"}})
	h := m.Hooks()
	h.Published(&relay.Message{Destination: "outbox.caf\xe9"}, time.Now())
	h.Skipped("public.caf\xe9")
	var dest []string
	for _, mt := range gather(t, m, "outboxrelay_messages_published_total") {
		dest = append(dest, labels(mt)["destination"])
	}
	if len(dest) != 1 || dest[0] != "outbox.caf\uFFFD" {
		t.Errorf("destinations %q, want [\"outbox.caf\\uFFFD\"]", dest)
	}
	if mts := gather(t, m, "outboxrelay_skipped_inserts_total"); len(mts) != 1 || labels(mts[0])["table"] != "public.caf\uFFFD" {
		t.Errorf("skipped_inserts_total %v", mts)
	}
}

// BenchmarkPublishedHook is the per-message metrics hook; uncached is the
// counter looked up by label values on every message, as before the cache,
// the reference for the ratio (the rest of the hook as in observePublished).
func BenchmarkPublishedHook(b *testing.B) {
	m := New(Config{Sink: "kafka", Slot: "orders"})
	msg := &relay.Message{Destination: "outbox.order", CommitTime: time.Now()}
	at := msg.CommitTime.Add(3 * time.Millisecond)
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.observePublished(msg, at)
		}
	})
	b.Run("uncached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.acknowledged.Add(1)
			m.published.WithLabelValues(m.cfg.Sink, label(msg.Destination)).Inc()
			m.latency.Observe(math.Max(0, at.Sub(msg.CommitTime).Seconds()))
			m.lastPublished.Store(at.UnixNano())
		}
	})
}
