// Package app wires the relay from a configuration: the PostgreSQL checks,
// the replication stream, the sink from the registry, the relay, the
// checkpoint writer, metrics, the HTTP endpoint, the consumer guard, the
// heartbeat, retention and partition maintenance. `outboxrelay run` and
// the demo both run an App, so that the demo shows the relay as it runs.
//
// The package reads no environment: the caller passes what it has read
// (Options.LookupEnv for the OpenTelemetry variables).
package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
)

// Options are what the caller knows beyond the configuration file.
type Options struct {
	// AcceptConfigChange takes over a slot that was consumed with another
	// publication or other tables (`run --accept-config-change`).
	AcceptConfigChange bool
	// LookupEnv reads the OpenTelemetry variables (OTEL_*); nil: tracing
	// is off.
	LookupEnv func(string) (string, bool)
	// Version and Revision label the build_info metric, the start log
	// line and the spans' service.version.
	Version, Revision string
	// Pipeline names the pipeline in its log lines (the pipeline field;
	// empty: config.DefaultPipeline) and, under a Process, its metrics
	// (the pipeline label).
	Pipeline string
	// PerPipeline is set by Process for each of its pipelines: the
	// metrics leave out the process's series, which Process serves once.
	PerPipeline bool
	// Gate is set by Process: it keeps the process to its share of the
	// pipelines among replicas (cdc.Config.Gate). Nil: no limit.
	Gate cdc.Gate
}

// App is the relay and the parts that report on it, wired from one
// configuration. Run it once.
type App struct {
	cfg      config.Config
	log      *zap.Logger
	opts     Options
	validate relay.Validator // nil: no schemas
	started  chan struct{}
	wired    atomic.Pointer[run] // the run once wire has built its relay
}

// New checks what can be checked without connecting (the schema folder)
// and returns the App. It starts nothing and connects to nothing.
func New(cfg config.Config, log *zap.Logger, opts Options) (*App, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Pipeline == "" {
		opts.Pipeline = config.DefaultPipeline
	}
	log = log.With(zap.String("pipeline", opts.Pipeline))
	validate, err := SchemaValidator(cfg.Relay.Schemas)
	if err != nil {
		return nil, err
	}
	return &App{cfg: cfg, log: log, opts: opts, validate: validate, started: make(chan struct{})}, nil
}

// Started is closed when the slot exists and the relay is about to stream:
// every row committed from then on is relayed. It stays open when Run
// fails or stops during startup.
func (a *App) Started() <-chan struct{} { return a.started }

// Run connects, checks PostgreSQL, opens the sink, and relays until ctx
// ends, then drains in-flight messages, records the final position and
// returns nil. A cancellation during startup is a clean stop too. Any
// other error is the reason the relay could not start or stopped; the
// relay has logged the details.
//
// It runs in phases: prepare checks PostgreSQL, open opens what the relay
// talks to, wire builds the relay and the parts that report on it, and
// serve runs them all. The slot is created between wire and serve, once
// everything has been checked: a slot that no relay reads keeps WAL until
// the disk fills, so a start that fails must leave pg_replication_slots as
// it found it. Whatever phase stops, the cleanup stack undoes the ones
// before it.
func (a *App) Run(ctx context.Context) error {
	r := &run{App: a}
	defer r.undo()
	defer a.wired.Store(nil)
	// A cancellation during startup is a request to stop, not a failure.
	startErr := func(err error) error {
		if ctx.Err() != nil {
			a.log.Info("stopped during startup", zap.String("error", err.Error()))
			return nil
		}
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.prepare(setupCtx); err != nil {
		return startErr(err)
	}
	if err := r.open(setupCtx); err != nil {
		return startErr(err)
	}
	if err := r.wire(ctx); err != nil {
		return startErr(err)
	}
	// Not setupCtx: a first start may publish many rows from the tables.
	if err := r.createSlot(ctx); err != nil {
		return startErr(err)
	}
	return r.serve(ctx)
}

// run is the state of one App.Run, filled in phase by phase.
type run struct {
	*App
	cleanup []func() // undo runs them last first

	// prepare
	conn     *pgx.Conn // closed once the slot exists
	database string
	// open
	traces   tracing
	sinks    []relay.NamedSink // config.SinkList's, opened
	relaying bool              // the relay owns the sinks, and closes them
	stream   *cdc.Stream
	dur      *durability
	guard    *cdc.Guard
	// wire
	progress   *store.Progress
	metrics    *metrics.Metrics
	relay      *relay.Relay
	srv        *admin.Server
	relayCtx   context.Context // /readyz and serve read whether it ended
	stopRelay  context.CancelFunc
	readStatus func(context.Context) (store.Status, error)
}

// errStarting is the readiness of an App whose relay is not built yet.
var errStarting = errors.New("starting")

// Ready is what /readyz reports for this App: nil while its relay streams
// and its broker answers, or the reason it does not.
func (a *App) Ready() error {
	r := a.wired.Load()
	if r == nil {
		return errStarting
	}
	return r.ready()
}

// Standby reports whether this App waits as a healthy standby: another
// relay holds the slot and the broker answers.
func (a *App) Standby() bool {
	r := a.wired.Load()
	return r != nil && r.standby()
}

// Streaming reports whether this App streams its slot now.
func (a *App) Streaming() bool {
	r := a.wired.Load()
	return r != nil && r.stream.Streaming()
}

// Status reads the slot's status, as GET /status does; an error before
// the App has connected.
func (a *App) Status(ctx context.Context) (store.Status, error) {
	r := a.wired.Load()
	if r == nil {
		return store.Status{}, errStarting
	}
	return r.readStatus(ctx)
}

// Gatherer is the App's metrics registry, nil before it is built.
func (a *App) Gatherer() prometheus.Gatherer {
	r := a.wired.Load()
	if r == nil {
		return nil
	}
	return r.metrics.Registry()
}

// push adds f to the cleanup stack.
func (r *run) push(f func()) { r.cleanup = append(r.cleanup, f) }

// undo runs the cleanup stack, last first.
func (r *run) undo() {
	for i := len(r.cleanup) - 1; i >= 0; i-- {
		r.cleanup[i]()
	}
}

// prepare connects and checks everything about PostgreSQL that can be
// checked without creating the slot.
func (r *run) prepare(ctx context.Context) error {
	cfg := r.cfg
	conn, err := Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return err
	}
	r.conn = conn
	r.push(func() { conn.Close(context.WithoutCancel(ctx)) })
	// The URL may name no database: ask the server.
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&r.database); err != nil {
		return fmt.Errorf("cannot query PostgreSQL: %v", err)
	}
	cdcCfg := cfg.CDC()
	cdcCfg.Log = r.log
	cdcCfg.AcceptConfigChange = r.opts.AcceptConfigChange
	created, err := cdc.Prepare(ctx, conn, store.Checkpoint{DB: conn, Slot: cfg.Postgres.Slot}, cdcCfg, cfg.Postgres.Columns.Required())
	if created {
		r.push(func() { r.dropPublication(ctx) })
	}
	if err == nil {
		p := cdc.Privileges{
			DeadLetters: cfg.Relay.DeadLetters, Heartbeat: cfg.Postgres.HeartbeatInterval > 0,
			Parking: cfg.Relay.DeadLetters && cfg.Relay.DeadLetterOrder == relay.DeadLetterPark,
			Spill:   spills(cfg),
		}
		if cfg.Postgres.Retention > 0 {
			p.Retention = cfg.Postgres.Tables
		}
		err = cdc.CheckPrivileges(ctx, conn, p)
	}
	if err != nil {
		return fmt.Errorf("prepare PostgreSQL: %w", err)
	}
	return nil
}

// dropPublication drops the publication prepare created when the start
// fails before the relay streams, so that a failed start leaves the
// database as it found it. After a start, the publication stays with the
// slot made after it.
func (r *run) dropPublication(ctx context.Context) {
	if r.relaying {
		return
	}
	pub := r.cfg.Postgres.Publication
	dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	dropped, err := store.DropPublication(dropCtx, r.conn, pub, r.cfg.Postgres.Slot)
	if err != nil {
		r.log.Warn("could not drop the publication this failed start created; if no relay uses it, drop it as the schema owner: DELETE FROM outboxrelay.coverage WHERE publication = '"+
			strings.ReplaceAll(pub, "'", "''")+"'; DROP PUBLICATION "+pgx.Identifier{pub}.Sanitize(),
			zap.String("publication", pub), zap.Error(err))
		return
	}
	if dropped {
		r.log.Info("dropped the publication this failed start created", zap.String("publication", pub))
	}
}

// open opens what the relay talks to: the span exporter, the sink, the
// replication stream and the pool that keeps the relay's state.
func (r *run) open(ctx context.Context) error {
	cfg := r.cfg
	lookup := r.opts.LookupEnv
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	traces, err := newTracing(ctx, lookup, r.opts.Version, r.log)
	if err != nil {
		return err
	}
	r.traces = traces
	r.push(func() {
		// After the relay has drained: every span it will end has ended.
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := traces.Shutdown(flushCtx); err != nil {
			r.log.Warn("OpenTelemetry spans not exported at shutdown", zap.Error(err))
		}
	})
	opened, err := openSinks(ctx, cfg, true, r.log)
	if err != nil {
		return err
	}
	r.sinks = opened
	r.push(func() {
		if !r.relaying {
			for _, ns := range opened {
				_ = ns.Sink.Close()
			}
		}
	})
	cdcCfg := cfg.CDC()
	cdcCfg.Gate = r.opts.Gate
	// A standby asks through the relay's pool whether the slot is free,
	// often and cheaply, rather than open a replication session per poll.
	cdcCfg.SlotActive = func(ctx context.Context) (bool, error) {
		var active bool
		err := r.dur.pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", cfg.Postgres.Slot).Scan(&active)
		return active, err
	}
	if r.stream, err = cdc.NewStream(cdcCfg, r.log); err != nil {
		return err
	}
	if err := r.stream.Ping(ctx); err != nil {
		return fmt.Errorf("prepare PostgreSQL: %w", err)
	}
	if r.dur, err = openDurability(ctx, cfg, r.log); err != nil {
		return err
	}
	r.push(r.dur.close)
	if err := r.dur.spillReady(ctx); err != nil {
		return err
	}
	if r.guard, err = r.dur.consumer(ctx); err != nil {
		return fmt.Errorf("prepare PostgreSQL: %w", err)
	}
	return nil
}

// wire builds the relay, its metrics and its HTTP endpoint, which starts
// listening so that a taken address fails the start. The relay's context
// derives from ctx, Run's.
func (r *run) wire(ctx context.Context) error {
	cfg, log := r.cfg, r.log
	slot := cfg.Postgres.Slot
	readStatus := func(ctx context.Context) (store.Status, error) {
		st, err := store.ReadStatus(ctx, r.dur.pool, slot)
		// The running relay knows its lag now; the database has the lag
		// since it last recorded, which an idle relay does only every
		// heartbeat interval (Progress.LagEvery).
		if since := r.relay.LagSince(); err == nil && st.Exists && !since.IsZero() {
			st.LagSince, st.LagSeconds = since, max(0, time.Since(since).Seconds())
		}
		if err == nil && len(cfg.Sinks) > 0 {
			st.Sinks = sinkStatus(r.relay.Sinks(), st.CurrentWALLSN)
		}
		return st, err
	}
	r.progress = store.NewProgress(r.dur.pool, slot, log)
	// The gauges read r.relay, which is set below, before the HTTP endpoint
	// can scrape them.
	r.metrics = metrics.New(metrics.Config{
		Sink:           cfg.Sink.Type,
		Slot:           slot,
		Pipeline:       pipelineLabel(r.opts),
		PerPipeline:    r.opts.PerPipeline,
		Version:        r.opts.Version,
		Revision:       r.opts.Revision,
		InFlight:       func() int { return r.relay.InFlight() },
		Unanswered:     func() time.Duration { d, _ := r.relay.Unanswered(); return d },
		LagSince:       func() time.Time { return r.relay.LagSince() },
		SinkLag:        r.sinkLag(),
		Standby:        r.stream.Standby,
		Rescued:        r.stream.Rescued,
		Destinations:   staticDestinations(cfg),
		IgnoredTables:  cfg.Postgres.IgnoreTables,
		DropsUnmatched: len(cfg.Routes) > 0 && cfg.Unmatched == rules.UnmatchedDrop,
		Status:         readStatus,
		Log:            log,
	})
	rc := cfg.RelayConfig()
	rc.Database = r.database
	opts := r.dur.options()
	opts.Hooks = relay.JoinHooks(relay.Hooks{Published: r.progress.Published, Republished: r.progress.Republished}, r.metrics.Hooks())
	opts.Resolver, opts.Validator, opts.Tracer = r.guard, r.validate, r.traces.Tracer()
	r.relay = relay.NewSinks(rc, r.sinks, log, opts)
	r.progress.LagSince = r.relay.LagSince
	r.progress.LagEvery = cfg.Postgres.HeartbeatInterval

	// relayCtx ends when Run's ctx does, or when the HTTP endpoint fails.
	// The parts that report on the relay (progress, metrics, HTTP) outlive
	// it until the relay has drained, so that they see its final state.
	r.relayCtx, r.stopRelay = context.WithCancel(ctx)
	r.push(r.stopRelay)
	r.readStatus = readStatus
	r.App.wired.Store(r)
	if cfg.HTTP.Listen == "" {
		return nil
	}
	r.srv = admin.New(admin.Config{
		Listen:  cfg.HTTP.Listen,
		Ready:   r.ready,
		Standby: r.standby,
		Status:  readStatus,
		Metrics: r.metrics.Handler(),
		Token:   cfg.HTTP.Token,
		Log:     log,
	})
	if err := r.srv.Listen(); err != nil {
		return fmt.Errorf("%v; choose a free address for http.listen", err)
	}
	return nil
}

// pipelineLabel is the pipeline label of the metrics: a single relay's
// series keep the labels they had before pipelines, so that its
// dashboards and alerts see the same series.
func pipelineLabel(opts Options) string {
	if !opts.PerPipeline {
		return ""
	}
	return opts.Pipeline
}

// standby reports whether the relay waits as a healthy standby.
func (r *run) standby() bool {
	return r.relayCtx.Err() == nil && r.stream.Standby() && r.sinksReady() == ""
}

// ready is /readyz: nil while the relay streams and its broker answers.
func (r *run) ready() error {
	silent := r.stream.Silent()
	switch {
	case r.relayCtx.Err() != nil:
		return errors.New("shutting down")
	case !r.stream.Streaming():
		return errors.New("replication is not streaming")
	case silent > r.stream.StallAfter():
		return fmt.Errorf("PostgreSQL has sent nothing on the replication connection for %s, although asked to reply (the connection may be lost)", silent.Round(100*time.Millisecond))
	case r.sinksReady() != "":
		return fmt.Errorf("%s sink is not connected", r.sinksReady())
	}
	return r.sinksAnswer()
}

// brokerWaits is each sink's wait for its broker's answer, for
// watchBroker.
func (r *run) brokerWaits() []brokerWait {
	states := r.relay.Sinks()
	out := make([]brokerWait, len(states))
	for i, s := range states {
		out[i] = brokerWait{sink: r.sinkLabel(i), silent: s.Unanswered, waiting: s.Held}
	}
	return out
}

// sinksAnswer is the part of /readyz that each sink answers for: nil, or
// why the first sink that fails is not ready, naming it.
func (r *run) sinksAnswer() error {
	for i, s := range r.relay.Sinks() {
		label := r.sinkLabel(i)
		switch {
		case s.Behind:
			return fmt.Errorf("sink %s is behind since %s: %d of its messages wait in outboxrelay.spilled, and the other sinks go on", label, s.BehindSince.UTC().Format(time.RFC3339), s.Spilled)
		case s.Retrying:
			return fmt.Errorf("sink %s is retrying failed publishes", label)
		case s.Unanswered >= brokerSilence:
			return fmt.Errorf("sink %s has answered nothing for %s (%d messages waiting)", label, s.Unanswered.Round(time.Second), s.Held)
		}
	}
	return nil
}

// createSlot creates the slot, or takes the one there, publishing the
// tables' rows first on a first start (see ensureSlot).
func (r *run) createSlot(ctx context.Context) error {
	created, err := r.ensureSlot(ctx, r.conn, r.dur.pool, r.database)
	if err != nil {
		return fmt.Errorf("prepare PostgreSQL: %w", err)
	}
	r.conn.Close(context.WithoutCancel(ctx))
	if slot := r.cfg.Postgres.Slot; created {
		r.log.Info("created replication slot: it keeps WAL until a relay reads it; if no relay will, drop it with SELECT pg_drop_replication_slot('"+slot+"')",
			zap.String("slot", slot))
	}
	return nil
}

// serve runs the relay and every part around it in one group, until ctx
// ends or the relay fails. The reporting parts stop after the relay has
// drained; the others stop with it.
func (r *run) serve(ctx context.Context) error {
	cfg, log := r.cfg, r.log
	stopLog := context.AfterFunc(r.relayCtx, func() { log.Info("shutting down") })
	defer stopLog()
	reportCtx, stopReport := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReport()

	var g errgroup.Group
	g.Go(func() error { return r.progress.Run(reportCtx) })
	g.Go(func() error { return r.metrics.Run(reportCtx) })
	if r.srv != nil {
		g.Go(func() error {
			err := r.srv.Run(reportCtx)
			if err != nil && reportCtx.Err() == nil {
				log.Error("http endpoint failed; stopping", zap.Error(err))
				r.stopRelay()
			}
			return err
		})
	}
	relayCtx := r.relayCtx
	g.Go(func() error {
		r.guard.Run(relayCtx, r.relay.Fail)
		return nil
	})
	g.Go(func() error { return r.dur.heartbeat(relayCtx) })
	g.Go(func() error {
		watchBroker(relayCtx, log, r.brokerWaits)
		return nil
	})
	g.Go(func() error {
		p := &progressLog{log: log, interval: 30 * time.Second, acknowledged: r.metrics.Acknowledged,
			inFlight: func() int { return r.relay.InFlight() }, lagBytes: r.metrics.LagBytes, lagSeconds: r.metrics.LagSeconds}
		p.run(relayCtx)
		return nil
	})
	g.Go(func() error { return r.dur.retention(relayCtx) })
	g.Go(func() error {
		store.RunMaintenance(relayCtx, r.dur.pool, store.MaintainConfig{Tables: QualifiedTables(cfg.Postgres.Tables), MaxAge: cfg.Postgres.Retention},
			time.Hour, log.Named("partitions"))
		return nil
	})

	for _, w := range Warnings(cfg) {
		log.Warn(w)
	}
	log.Info("starting", zap.String("version", r.opts.Version), zap.String("revision", r.opts.Revision), zap.String("sink", cfg.Sink.Type),
		zap.String("slot", cfg.Postgres.Slot), zap.Strings("tables", cfg.Postgres.Tables))
	close(r.started)
	r.relaying = true
	var relayErr error // joined with the group's, as both may fail
	g.Go(func() error {
		relayErr = r.relay.Run(relayCtx, r.stream)
		if relayErr != nil {
			recCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			if err := (store.Checkpoint{DB: r.dur.pool, Slot: cfg.Postgres.Slot}).RecordError(recCtx, relayErr); err != nil {
				log.Warn("could not record the error for status", zap.Error(err))
			}
			cancel()
		}
		r.stopRelay() // after a fatal error too: the heartbeat stops with it
		stopReport()
		return nil
	})
	err := g.Wait()
	return errors.Join(relayErr, err)
}

// staticDestinations is the destination every message goes to when the
// sink's template has no placeholder, so that messages_published_total
// exists from the start.
func staticDestinations(cfg config.Config) []string {
	if d, ok := cfg.Sink.Settings().(interface{ StaticDestinations() []string }); ok {
		return d.StaticDestinations()
	}
	return nil
}

// OpenSink creates the configured sink, non-transactionally, and checks
// that its broker answers, so that an unreachable broker is one clear
// error. It is for the commands that publish or read outside the relay's
// position (dlq replay, verify); Run opens its own.
func OpenSink(ctx context.Context, cfg config.Config, log *zap.Logger) (relay.Sink, error) {
	if len(cfg.Sinks) == 0 {
		return openSink(ctx, cfg, false, log)
	}
	sinks, err := openSinks(ctx, cfg, false, log)
	if err != nil {
		return nil, err
	}
	return newFanout(sinks), nil
}

// openSink opens the sink as its package says (sinks.Settings.Open). Only
// the relay's sink (forRelay) may hold the relay's position
// (sinks.RelayOnly: sink.kafka.exactly_once).
func openSink(ctx context.Context, cfg config.Config, forRelay bool, log *zap.Logger) (relay.Sink, error) {
	set := cfg.Sink.Settings()
	if set == nil {
		return nil, fmt.Errorf("sink.type %q is not a registered sink", cfg.Sink.Type)
	}
	if rs, ok := set.(sinks.RelayOnly); ok {
		if forRelay {
			set = rs.ForRelay(cfg.Postgres.Slot)
		} else {
			set = rs.Detached()
		}
	}
	return set.Open(ctx, log)
}

// Connect opens a regular PostgreSQL connection, failing with one clear
// line that names the settings to check.
func Connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("invalid PostgreSQL URL: %v", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL: %v%s", err, tlsHint(err))
	}
	return conn, nil
}

// tlsHint names the settings to check when err is a PostgreSQL server
// certificate that did not verify, and is empty otherwise.
func tlsHint(err error) string {
	if sinks.CertError(err) != nil {
		return "; the server's TLS certificate did not verify: check sslrootcert and sslmode in postgres.url"
	}
	return ""
}

// QualifiedTables writes each configured table as schema.name.
func QualifiedTables(tables []string) []string { return config.QualifiedTables(tables) }
