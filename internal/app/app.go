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
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
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
}

// App is the relay and the parts that report on it, wired from one
// configuration. Run it once.
type App struct {
	cfg      config.Config
	log      *zap.Logger
	opts     Options
	validate func(*envelope.Message) error
	started  chan struct{}
}

// New checks what can be checked without connecting (the schema folder)
// and returns the App. It starts nothing and connects to nothing.
func New(cfg config.Config, log *zap.Logger, opts Options) (*App, error) {
	if log == nil {
		log = zap.NewNop()
	}
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
func (a *App) Run(ctx context.Context) error {
	cfg, log := a.cfg, a.log
	// A cancellation during startup is a request to stop, not a failure.
	startErr := func(err error) error {
		if ctx.Err() != nil {
			log.Info("stopped during startup", zap.String("error", err.Error()))
			return nil
		}
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := Connect(setupCtx, cfg.Postgres.URL)
	if err != nil {
		return startErr(err)
	}
	var database string // the URL may name none: ask the server
	if err := conn.QueryRow(setupCtx, "SELECT current_database()").Scan(&database); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return startErr(fmt.Errorf("cannot query PostgreSQL: %v", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	cdcCfg := cfg.CDC()
	cdcCfg.Log = log
	cdcCfg.AcceptConfigChange = a.opts.AcceptConfigChange
	// Everything is checked before the slot is created: a slot that no relay
	// reads keeps WAL until the disk fills, so a start that fails must leave
	// pg_replication_slots as it found it.
	err = cdc.Prepare(setupCtx, conn, store.Checkpoint{DB: conn, Slot: cfg.Postgres.Slot}, cdcCfg, cfg.Postgres.Columns.Required())
	if err == nil {
		p := cdc.Privileges{
			DeadLetters: cfg.Relay.DeadLetters, Heartbeat: cfg.Postgres.HeartbeatInterval > 0,
			Parking: cfg.Relay.DeadLetters && cfg.Relay.DeadLetterOrder == string(relay.DeadLetterPark),
		}
		if cfg.Postgres.Retention > 0 {
			p.Retention = cfg.Postgres.Tables
		}
		err = cdc.CheckPrivileges(setupCtx, conn, p)
	}
	if err != nil {
		return startErr(fmt.Errorf("prepare PostgreSQL: %w", err))
	}
	lookup := a.opts.LookupEnv
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	traces, err := newTracing(setupCtx, lookup, a.opts.Version, log)
	if err != nil {
		return startErr(err)
	}
	defer func() {
		// After the relay has drained: every span it will end has ended.
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := traces.Shutdown(flushCtx); err != nil {
			log.Warn("OpenTelemetry spans not exported at shutdown", zap.Error(err))
		}
	}()
	sink, err := openSink(setupCtx, cfg, true, log)
	if err != nil {
		return startErr(err)
	}
	stream, err := cdc.NewStream(cfg.CDC(), log)
	if err != nil {
		_ = sink.Close()
		return err
	}
	if err := stream.Ping(setupCtx); err != nil {
		_ = sink.Close()
		return startErr(fmt.Errorf("prepare PostgreSQL: %w", err))
	}

	dur, err := openDurability(setupCtx, cfg, log)
	if err != nil {
		_ = sink.Close()
		return startErr(err)
	}
	defer dur.close()
	guard, err := dur.consumer(setupCtx)
	if err != nil {
		_ = sink.Close()
		return startErr(fmt.Errorf("prepare PostgreSQL: %w", err))
	}
	slot := cfg.Postgres.Slot
	readStatus := func(ctx context.Context) (store.Status, error) { return store.ReadStatus(ctx, dur.pool, slot) }
	progress := store.NewProgress(dur.pool, slot, log)
	// r is set below, before the HTTP endpoint can scrape the inflight gauge.
	var r *relay.Relay
	m := metrics.New(metrics.Config{
		Sink:          cfg.Sink.Type,
		Slot:          slot,
		Version:       a.opts.Version,
		Revision:      a.opts.Revision,
		Inflight:      func() int { return r.Inflight() },
		Unanswered:    func() time.Duration { d, _ := r.Unanswered(); return d },
		LagSince:      func() time.Time { return r.LagSince() },
		Standby:       stream.Standby,
		Destinations:  staticDestinations(cfg),
		IgnoredTables: cfg.Postgres.IgnoreTables,
		Status:        readStatus,
		Log:           log,
	})
	rc := relay.Config{
		Database:          database,
		Tables:            QualifiedTables(cfg.Postgres.Tables),
		Columns:           cfg.Postgres.Columns,
		MessagePrefix:     cfg.Postgres.MessagePrefix,
		MaxInFlight:       cfg.Relay.MaxInFlight,
		MaxInFlightBytes:  cfg.Relay.MaxInFlightBytes,
		MaxAttempts:       cfg.Relay.MaxAttempts,
		Format:            relay.Format(cfg.Envelope.Format),
		CloudEventsSource: cfg.Envelope.Source,
		Hooks:             relay.JoinHooks(relay.Hooks{Published: progress.Published}, m.Hooks()),
		Resolve:           guard.Resolve,
		Tracer:            traces.Tracer(),
		MessagingSystem:   cfg.Sink.Type,
	}
	rc.Validate = a.validate
	dur.apply(&rc)
	r = relay.New(rc, sink, log)
	progress.LagSince = r.LagSince

	// relayCtx ends when ctx does, or when the HTTP endpoint fails. The
	// parts that report on the relay (progress, metrics, HTTP) outlive it
	// until the relay has drained, so that they see its final state.
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	var srv *admin.Server
	if cfg.HTTP.Listen != "" {
		srv = admin.New(admin.Config{
			Listen: cfg.HTTP.Listen,
			Ready: func() error {
				silent := stream.Silent()
				switch {
				case relayCtx.Err() != nil:
					return errors.New("shutting down")
				case !stream.Streaming():
					return errors.New("replication is not streaming")
				case silent > stream.StallAfter():
					return fmt.Errorf("PostgreSQL has sent nothing on the replication connection for %s, although asked to reply (the connection may be lost)", silent.Round(100*time.Millisecond))
				case !sink.Ready():
					return fmt.Errorf("%s sink is not connected", cfg.Sink.Type)
				case r.Retrying():
					return errors.New("retrying failed publishes")
				}
				if d, n := r.Unanswered(); d >= brokerSilence {
					return fmt.Errorf("the %s broker has answered nothing for %s (%d messages waiting)", cfg.Sink.Type, d.Round(time.Second), n)
				}
				return nil
			},
			Standby: func() bool { return relayCtx.Err() == nil && stream.Standby() && sink.Ready() },
			Status:  readStatus,
			Metrics: m.Handler(),
			Token:   cfg.HTTP.Token,
			Log:     log,
		})
		if err := srv.Listen(); err != nil {
			_ = sink.Close()
			return fmt.Errorf("%v; choose a free address for http.listen", err)
		}
	}
	// Not setupCtx: a first start may publish many rows from the tables.
	createdSlot, err := a.ensureSlot(ctx, conn, dur.pool, database)
	if err != nil {
		_ = sink.Close()
		return startErr(fmt.Errorf("prepare PostgreSQL: %w", err))
	}
	conn.Close(context.WithoutCancel(ctx))
	if createdSlot {
		log.Info("created replication slot: it keeps WAL until a relay reads it; if no relay will, drop it with SELECT pg_drop_replication_slot('"+cfg.Postgres.Slot+"')",
			zap.String("slot", cfg.Postgres.Slot))
	}

	stopLog := context.AfterFunc(relayCtx, func() { log.Info("shutting down") })
	defer stopLog()

	reportCtx, stopReport := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReport()
	var report errgroup.Group
	report.Go(func() error { return progress.Run(reportCtx) })
	report.Go(func() error { return m.Run(reportCtx) })
	if srv != nil {
		report.Go(func() error {
			err := srv.Run(reportCtx)
			if err != nil && reportCtx.Err() == nil {
				log.Error("http endpoint failed; stopping", zap.Error(err))
				stopRelay()
			}
			return err
		})
	}
	report.Go(func() error {
		guard.Run(relayCtx, r.Fail)
		return nil
	})
	report.Go(func() error { return dur.heartbeat(relayCtx) })
	report.Go(func() error {
		watchBroker(relayCtx, log, cfg.Sink.Type, r.Unanswered)
		return nil
	})
	report.Go(func() error {
		p := &progressLog{log: log, interval: 30 * time.Second, acknowledged: m.Acknowledged,
			inflight: func() int { return r.Inflight() }, lagBytes: m.LagBytes, lagSeconds: m.LagSeconds}
		p.run(relayCtx)
		return nil
	})
	report.Go(func() error { return dur.retention(relayCtx) })
	report.Go(func() error {
		store.RunMaintenance(relayCtx, dur.pool, store.MaintainConfig{Tables: QualifiedTables(cfg.Postgres.Tables), MaxAge: cfg.Postgres.Retention},
			time.Hour, log.Named("partitions"))
		return nil
	})

	for _, w := range Warnings(cfg) {
		log.Warn(w)
	}
	log.Info("starting", zap.String("version", a.opts.Version), zap.String("revision", a.opts.Revision), zap.String("sink", cfg.Sink.Type),
		zap.String("slot", cfg.Postgres.Slot), zap.Strings("tables", cfg.Postgres.Tables))
	close(a.started)
	err = r.Run(relayCtx, stream)
	if err != nil {
		recCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
		if rerr := (store.Checkpoint{DB: dur.pool, Slot: slot}).RecordError(recCtx, err); rerr != nil {
			log.Warn("could not record the error for status", zap.Error(rerr))
		}
		cancel()
	}
	stopRelay() // after a fatal error too: the heartbeat stops with it
	stopReport()
	return errors.Join(err, report.Wait())
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
	return openSink(ctx, cfg, false, log)
}

// openSink opens the sink as its package says (sinks.Settings.Open). Only
// the relay's sink (forRelay) may be transactional (sink.kafka.exactly_once).
func openSink(ctx context.Context, cfg config.Config, forRelay bool, log *zap.Logger) (relay.Sink, error) {
	set := cfg.Sink.Settings()
	if set == nil {
		return nil, fmt.Errorf("sink.type %q is not a registered sink", cfg.Sink.Type)
	}
	if k, ok := set.(*kafka.Config); ok && k.ExactlyOnce {
		c := *k
		if !forRelay {
			c.ExactlyOnce = false
		} else if c.TransactionalID == "" {
			c.TransactionalID = kafka.TransactionalID(cfg.Postgres.Slot)
		}
		set = &c
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
func QualifiedTables(tables []string) []string {
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		if schema, name, err := cdc.SplitTable(t); err == nil {
			out = append(out, schema+"."+name)
		}
	}
	return out
}
