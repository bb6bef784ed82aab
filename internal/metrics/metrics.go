// Package metrics exposes the relay's Prometheus metrics (prefix
// outboxrelay_). It observes the pipeline through relay.Hooks and through
// functions it calls on scrape or on a timer, so nothing in the relay's
// path calls into it directly. Every Metrics has its own registry; the
// global one is never touched.
package metrics

import (
	"cmp"
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Namespace prefixes every metric name.
const Namespace = "outboxrelay"

// LatencyBuckets are the end_to_end_latency_seconds buckets: 1ms to 60s,
// dense where a healthy relay lives (below a second) and coarse for the
// minutes a broker outage adds.
var LatencyBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 20, 30, 60,
}

// Config configures New. Every field is optional.
type Config struct {
	// Sink is the sink label: kafka, rabbitmq.
	Sink string
	// Slot is the slot label of every outboxrelay_ series but build_info.
	Slot string
	// Pipeline is the pipeline label of every outboxrelay_ series but
	// build_info (config.Unit.Name; default for a single pipeline).
	Pipeline string
	// PerPipeline leaves out build_info and the Go runtime and process
	// collectors: a process that runs many pipelines registers those once
	// (NewProcess), beside each pipeline's registry.
	PerPipeline bool
	// Version and Revision are the labels of build_info.
	Version, Revision string
	// Unanswered reports how long the sink has held messages without
	// reporting any outcome (relay.Relay.Unanswered); read on every scrape.
	Unanswered func() time.Duration
	// LagSince reports the commit time replication_lag_seconds counts from
	// (relay.Relay.LagSince; zero while unknown); read on every scrape.
	// While it is unknown, and on a standby, the gauge shows the figure PostgreSQL computes
	// from the last record (store.Status.LagSeconds), and before any
	// record the time since New.
	LagSince func() time.Time
	// SinkLag reports each sink's own progress when the relay feeds
	// several (relay.Relay.Sinks), for sink_lag_bytes and
	// sink_lag_seconds; nil: those series are absent. Read on every scrape.
	SinkLag func() []SinkLag
	// Standby reports whether this process waits as a standby
	// (cdc.Stream.Standby); read on every scrape for role.
	Standby func() bool
	// Rescued reports whether this process streams the pipeline above its
	// share of the replicas (cdc.Stream.Rescued); read on every scrape.
	Rescued func() bool
	// Destinations are the destinations known at start (a topic template
	// without placeholders): messages_published_total starts at 0 for them.
	Destinations []string
	// IgnoredTables start skipped_inserts_total at 0.
	IgnoredTables []string
	// DropsUnmatched (the rules say unmatched: drop) starts
	// messages_filtered_total{route="unmatched"} at 0.
	DropsUnmatched bool
	// InFlight reports the messages handed to the sink and not yet
	// acknowledged (relay.Relay.InFlight); read on every scrape.
	InFlight func() int
	// Status reads the slot's status (store.ReadStatus) for the slot's series.
	// Run calls it every
	// PollInterval (default 5s), each call bounded by PollInterval.
	Status       func(ctx context.Context) (store.Status, error)
	PollInterval time.Duration
	Log          *zap.Logger
}

// Metrics holds the collectors. Its hooks are safe for concurrent use.
type Metrics struct {
	cfg      Config
	log      *zap.Logger
	registry *prometheus.Registry

	published *prometheus.CounterVec
	// publishedTo caches published's counter per destination (string to
	// prometheus.Counter): the per-message hook then hashes no label values
	// and validates no UTF-8. It holds what published holds, so it is
	// bounded by the same destinations.
	publishedTo   sync.Map
	publishErrors *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	filtered      *prometheus.CounterVec
	reserved      *prometheus.CounterVec
	republished   *prometheus.CounterVec
	lag           prometheus.Gauge
	retained      prometheus.Gauge
	keepSize      prometheus.Gauge
	walStatus     *prometheus.GaugeVec
	latency       prometheus.Histogram
	// lastPublished is the newest acknowledgement, in Unix nanoseconds.
	lastPublished atomic.Int64
	acknowledged  atomic.Uint64
	// lagBytes is the last replication_lag_bytes, -1 while unknown.
	lagBytes atomic.Int64
	started  time.Time
	// polledLag is the last lag_seconds PostgreSQL computed (math.Float64bits),
	// polledAt when it was read (Unix nanoseconds, 0: never).
	polledLag, polledAt atomic.Uint64
	// currentWAL is the server's position the last poll read (0: unknown).
	currentWAL atomic.Uint64
}

// New registers the collectors (with the Go runtime and process
// collectors) in a new registry. It starts nothing.
func New(cfg Config) *Metrics {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	m := &Metrics{cfg: cfg, log: cfg.Log.Named("metrics"), registry: prometheus.NewRegistry(), started: time.Now()}
	m.lagBytes.Store(-1)
	m.published = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "messages_published_total",
		Help: "Messages the broker acknowledged, by sink and destination (topic or routing key).",
	}, []string{"sink", "destination"})
	m.publishErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "publish_errors_total",
		Help: "Failed publish attempts, by sink and reason (retryable: retried without limit; permanent: dead-lettered after max_attempts).",
	}, []string{"sink", "reason"})
	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "dead_letters_total",
		Help: "Messages stored in outboxrelay.dead_letters by this process, by reason (permanent: the broker refused it max_attempts times; invalid: not a valid outbox message).",
	}, []string{"reason"})
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "skipped_inserts_total",
		Help: "Inserts into tables listed in postgres.ignore_tables, which the relay does not publish, by table.",
	}, []string{"table"})
	m.filtered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "messages_filtered_total",
		Help: "Rows the routing rules dropped and did not publish, by route (unmatched: no route matched and unmatched is drop).",
	}, []string{"route"})
	m.reserved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "reserved_headers_dropped_total",
		Help: "Row headers dropped because their name is one the relay owns, by the reserved name or prefix (ce_*) they matched; rename them in the producer.",
	}, []string{"header"})
	m.republished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "messages_republished_total",
		Help: "Messages this process published again while the broker may already hold them, by reason (retry: a retry after a retryable failure such as a timeout or a lost connection). What a killed or replaced process published past the slot's confirmed position is not counted: the new process cannot know it.",
	}, []string{"reason"})
	m.lag = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "replication_lag_bytes",
		Help: "WAL bytes between the server's current position and the older of the slot's confirmed_flush_lsn and restart_lsn, refreshed every few seconds.",
	})
	lagSeconds := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "replication_lag_seconds",
		Help: "Age of the oldest committed outbox message the broker has not acknowledged; when none is pending, time since the newest transaction (heartbeat) the relay saw.",
	}, m.lagSeconds)
	m.retained = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "slot_retained_wal_bytes",
		Help: "WAL the server keeps for the slot (current position minus restart_lsn), refreshed every few seconds.",
	})
	m.keepSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "max_slot_wal_keep_size_bytes",
		Help: "The server's max_slot_wal_keep_size: past it the slot loses WAL (wal_status lost); -1 when unlimited.",
	})
	m.keepSize.Set(-1)
	m.walStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "slot_wal_status",
		Help: "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others; all 0 while the slot is missing.",
	}, []string{"status"})
	unanswered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "sink_unanswered_seconds",
		Help: "How long the broker has held messages without answering any (acknowledgement or error); 0 while it holds none.",
	}, func() float64 {
		if cfg.Unanswered == nil {
			return 0
		}
		return cfg.Unanswered().Seconds()
	})
	role := newRoleCollector(cfg.Standby)
	rescued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "replica_rescued",
		Help: "1 while this process streams the pipeline above its share of the replicas, because no replica with room served it (one cannot reach its database?).",
	}, func() float64 {
		if cfg.Rescued != nil && cfg.Rescued() {
			return 1
		}
		return 0
	})
	for _, ws := range walStatuses {
		m.walStatus.WithLabelValues(ws)
	}
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "end_to_end_latency_seconds",
		Help:    "Time from the source transaction's commit to the broker's acknowledgement.",
		Buckets: LatencyBuckets,
	})
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "inflight_messages",
		Help: "Messages handed to the sink and not yet acknowledged.",
	}, func() float64 {
		if cfg.InFlight == nil {
			return 0
		}
		return float64(cfg.InFlight())
	})
	last := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "last_published_timestamp_seconds",
		Help: "Unix time of the newest broker acknowledgement; 0 before the first.",
	}, func() float64 {
		return float64(m.lastPublished.Load()) / 1e9
	})
	// A pipeline relays one slot: every series of it is the slot's.
	labels := prometheus.Labels{}
	if cfg.Slot != "" {
		labels["slot"] = cfg.Slot
	}
	if cfg.Pipeline != "" {
		labels["pipeline"] = cfg.Pipeline
	}
	prometheus.WrapRegistererWith(labels, m.registry).MustRegister(m.published, m.publishErrors, m.deadLetters, m.skipped, m.filtered, m.reserved, m.republished, m.lag, lagSeconds, m.retained, m.keepSize,
		m.walStatus, m.latency, inflight, last, unanswered, role, rescued)
	if cfg.SinkLag != nil {
		prometheus.WrapRegistererWith(labels, m.registry).MustRegister(newSinkCollector(cfg.SinkLag, &m.currentWAL))
	}
	if !cfg.PerPipeline {
		registerProcess(m.registry, cfg.Version, cfg.Revision)
	}
	// Every error series exists from the start, so rate() and alerts see 0.
	for _, reason := range []string{reasonRetryable, reasonPermanent} {
		m.publishErrors.WithLabelValues(cfg.Sink, reason)
	}
	for _, reason := range []string{reasonPermanent, reasonInvalid} {
		m.deadLetters.WithLabelValues(reason)
	}
	for _, reason := range relay.RepublishedReasons {
		m.republished.WithLabelValues(reason)
	}
	for _, d := range cfg.Destinations {
		m.published.WithLabelValues(cfg.Sink, label(d))
	}
	for _, t := range cfg.IgnoredTables {
		m.skipped.WithLabelValues(label(t))
	}
	if cfg.DropsUnmatched {
		m.filtered.WithLabelValues(relay.FilteredUnmatched)
	}
	for _, h := range envelope.ReservedForms() {
		m.reserved.WithLabelValues(h)
	}
	return m
}

// registerProcess registers the series of the process rather than of a
// pipeline: build_info and the Go runtime's and process's collectors.
func registerProcess(reg *prometheus.Registry, version, revision string) {
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision},
	})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// NewProcess returns the registry of a process that runs many pipelines:
// build_info and the runtime's collectors, once. Serve it with the
// pipelines' registries through Gatherers.
func NewProcess(version, revision string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	registerProcess(reg, version, revision)
	return reg
}

// Gatherers serves the process's registry and each pipeline's as one
// exposition; gather returns the registries at the time of the scrape, as
// pipelines restart with new ones.
func Gatherers(gather func() []prometheus.Gatherer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		promhttp.HandlerFor(prometheus.Gatherers(gather()), promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
}

// lagSeconds is read on scrape: the running relay knows best; PostgreSQL's
// figure is aged by the time since it was read, so it grows between polls
// as it would in the view.
func (m *Metrics) lagSeconds() float64 {
	now := time.Now()
	// A standby's own figure is stale (from when it last held the slot, if
	// ever): the active relay's record in PostgreSQL is the slot's.
	standby := m.cfg.Standby != nil && m.cfg.Standby()
	if m.cfg.LagSince != nil && !standby {
		if since := m.cfg.LagSince(); !since.IsZero() {
			return math.Max(0, now.Sub(since).Seconds())
		}
	}
	if at := m.polledAt.Load(); at != 0 {
		return math.Float64frombits(m.polledLag.Load()) + now.Sub(time.Unix(0, int64(at))).Seconds()
	}
	return now.Sub(m.started).Seconds()
}

// roleCollector reports role{role="active"} and role{role="standby"}, one of
// them 1, read on scrape.
type roleCollector struct {
	desc    *prometheus.Desc
	standby func() bool
}

func newRoleCollector(standby func() bool) *roleCollector {
	return &roleCollector{
		desc: prometheus.NewDesc(Namespace+"_role",
			"1 for this process's role: active (holds or is taking the slot) or standby (waits while another process holds it).",
			[]string{"role"}, nil),
		standby: standby,
	}
}

func (c *roleCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *roleCollector) Collect(ch chan<- prometheus.Metric) {
	active, standby := 1.0, 0.0
	if c.standby != nil && c.standby() {
		active, standby = 0, 1
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, active, "active")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, standby, "standby")
}

// Registry returns the registry holding every collector.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

const (
	reasonRetryable = "retryable"
	reasonPermanent = "permanent"
	reasonInvalid   = "invalid"
)

// label returns v as a label value. client_golang panics on a label value
// that is not valid UTF-8, after the broker has acknowledged the message,
// so that every restart would publish it again and panic again. The sinks
// refuse such destinations (sinks.CheckDestination); this is the second
// line: v with each invalid byte replaced by U+FFFD.
func label(v string) string {
	if utf8.ValidString(v) {
		return v
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

// Reason classifies a publish error for the reason label, with the relay's
// own predicate.
func Reason(err error) string {
	if relay.Retryable(err) {
		return reasonRetryable
	}
	return reasonPermanent
}

// Hooks returns the relay hooks that feed the metrics. They never block.
func (m *Metrics) Hooks() relay.Hooks {
	return relay.Hooks{
		Published:     m.observePublished,
		PublishFailed: m.observeFailed,
		DeadLettered:  m.observeDeadLettered,
		Skipped:       func(table string) { m.skipped.WithLabelValues(label(table)).Inc() },
		Filtered:      func(route string) { m.filtered.WithLabelValues(label(route)).Inc() },
		ReservedHeaderDropped: func(_ *relay.Message, reserved string) {
			m.reserved.WithLabelValues(reserved).Inc()
		},
		Republished: func(_ *relay.Message, reason string) { m.republished.WithLabelValues(reason).Inc() },
	}
}

// Acknowledged returns the number of messages the broker acknowledged
// since New. Safe for concurrent use.
func (m *Metrics) Acknowledged() uint64 { return m.acknowledged.Load() }

// LagBytes returns the last replication_lag_bytes read, and false while it
// is unknown. Safe for concurrent use.
func (m *Metrics) LagBytes() (int64, bool) {
	v := m.lagBytes.Load()
	return v, v >= 0
}

// LagSeconds returns replication_lag_seconds as a scrape would. Safe for
// concurrent use.
func (m *Metrics) LagSeconds() float64 { return m.lagSeconds() }

func (m *Metrics) observePublished(msg *relay.Message, ackedAt time.Time) {
	m.acknowledged.Add(1)
	m.publishedCounter(msg.Sink, msg.Destination).Inc()
	if !msg.CommitTime.IsZero() {
		// The commit time is the database server's clock: clamp skew.
		m.latency.Observe(math.Max(0, ackedAt.Sub(msg.CommitTime).Seconds()))
	}
	now := ackedAt.UnixNano()
	for {
		old := m.lastPublished.Load()
		if old >= now || m.lastPublished.CompareAndSwap(old, now) {
			return
		}
	}
}

// publishedCounter returns published's counter for destination d of the
// sink named sink: its name under the sinks section, or "" for the one
// sink, labelled with Config.Sink.
func (m *Metrics) publishedCounter(sink, d string) prometheus.Counter {
	key := d
	if sink != "" {
		key = sink + "\x00" + d
	}
	if c, ok := m.publishedTo.Load(key); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.publishedTo.LoadOrStore(key, m.published.WithLabelValues(cmp.Or(sink, m.cfg.Sink), label(d)))
	return c.(prometheus.Counter)
}

// A dead letter the broker never refused is one the relay could not build.
func (m *Metrics) observeDeadLettered(msg *relay.Message) {
	reason := reasonInvalid
	var p *relay.PermanentError
	if errors.As(msg.LastError, &p) {
		reason = reasonPermanent
	}
	m.deadLetters.WithLabelValues(reason).Inc()
}

func (m *Metrics) observeFailed(msg *relay.Message, err error) {
	m.publishErrors.WithLabelValues(cmp.Or(msg.Sink, m.cfg.Sink), Reason(err)).Inc()
}

// Run refreshes the slot's series (replication_lag_bytes, slot_wal_status,
// slot_retained_wal_bytes, and lag_seconds while the relay has no figure of
// its own) from
// Config.Status at once and then every PollInterval until ctx is cancelled,
// and returns nil. A failed read is logged at debug level and leaves the
// previous values. Without Config.Status it only waits for ctx.
//
// Polling rather than querying on scrape keeps scrapes fast and the load on
// PostgreSQL fixed however many scrapers there are, at the price of values
// up to PollInterval old.
func (m *Metrics) Run(ctx context.Context) error {
	if m.cfg.Status == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(m.cfg.PollInterval)
	defer t.Stop()
	for {
		readCtx, cancel := context.WithTimeout(ctx, m.cfg.PollInterval)
		st, err := m.cfg.Status(readCtx)
		cancel()
		switch {
		case err == nil:
			m.observeSlot(st)
		case ctx.Err() == nil:
			m.log.Debug("read slot status", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (m *Metrics) observeSlot(st store.Status) {
	m.currentWAL.Store(uint64(st.CurrentWALLSN))
	if st.LagKnown() {
		m.lag.Set(float64(st.LagBytes))
		m.lagBytes.Store(max(0, st.LagBytes))
	}
	if st.RetainedKnown() {
		m.retained.Set(float64(st.RetainedWALBytes))
	}
	if st.MaxSlotWALKeepSize != 0 {
		m.keepSize.Set(float64(st.MaxSlotWALKeepSize))
	}
	if st.LagSecondsKnown() {
		m.polledLag.Store(math.Float64bits(st.LagSeconds))
		m.polledAt.Store(uint64(time.Now().UnixNano()))
	}
	for _, ws := range walStatuses {
		v := 0.0
		if st.Exists && st.WALStatus == ws {
			v = 1
		}
		m.walStatus.WithLabelValues(ws).Set(v)
	}
}
