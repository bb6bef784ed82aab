package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/kafka"
)

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", "run --config FILE [--check-config] [--accept-config-change]",
		"Relay committed outbox rows to the configured sink until SIGTERM or SIGINT, then drain and exit 0.")
	path := fs.String("config", "", "YAML configuration file")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	accept := fs.Bool("accept-config-change", false, "take over a slot that was consumed with another publication or other tables, or whose tables changed identity, and record the new configuration")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(*path, os.LookupEnv)
	if err != nil {
		return usageErr("invalid configuration: %v", err)
	}
	if err := checkTemplates(cfg); err != nil {
		return usageErr("invalid configuration: %v", err)
	}
	if *check {
		if _, err := schemaValidator(cfg.Relay.Schemas); err != nil {
			return err
		}
		// The effective configuration, defaults and environment applied,
		// secrets hidden, as YAML: safe to paste into a ticket.
		out, err := cfg.RedactedYAML()
		if err != nil {
			return usageErr("print configuration: %v", err)
		}
		fmt.Fprintf(stdout, "# configuration ok: %s sink, slot %s, tables %v\n", cfg.Sink.Type, cfg.Postgres.Slot, cfg.Postgres.Tables)
		for _, w := range securityWarnings(cfg) {
			fmt.Fprintf(stdout, "# warning: %s\n", w)
		}
		_, err = stdout.Write(out)
		return err
	}
	log, err := newLogger(cfg.Log.Level, stderr)
	if err != nil {
		return usageErr("log.level: %v", err)
	}
	defer log.Sync() // best effort at exit

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err = run(ctx, cfg, log, *accept)
	if err != nil {
		// main prints the one line; the relay has logged the details.
		return &exitError{code: exitUsage, err: err}
	}
	log.Info("stopped cleanly")
	return nil
}

func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core), nil
}

// run wires the relay from the configuration and runs it until ctx ends.
func run(ctx context.Context, cfg config.Config, log *zap.Logger, acceptConfigChange bool) error {
	// Memory is bounded by the in-flight window; tell the garbage collector
	// so, unless the operator chose a limit (GOMEMLIMIT). Measured: peak RSS
	// of a 10 KB-row backlog fell from 119-157 MB to 95 MB, at the same speed.
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(cfg.Relay.MaxInFlightBytes + 64<<20)
	}
	// A signal during startup is a request to stop, not a failure.
	startErr := func(err error) error {
		if ctx.Err() != nil {
			log.Info("stopped during startup", zap.String("error", err.Error()))
			return nil
		}
		return err
	}
	validate, err := schemaValidator(cfg.Relay.Schemas)
	if err != nil {
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connect(setupCtx, cfg.Postgres.URL)
	if err != nil {
		return startErr(err)
	}
	var database string // the URL may name none: ask the server
	if err := conn.QueryRow(setupCtx, "SELECT current_database()").Scan(&database); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return startErr(usageErr("cannot query PostgreSQL: %v", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	cdcCfg := cfg.CDC()
	cdcCfg.Log = log
	cdcCfg.AcceptConfigChange = acceptConfigChange
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
	traces, err := newTracing(setupCtx, os.LookupEnv, log)
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
	sink, err := openRelaySink(setupCtx, cfg, log)
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
	build := currentBuild()
	m := metrics.New(metrics.Config{
		Sink:          cfg.Sink.Type,
		Slot:          slot,
		Version:       build.Version,
		Revision:      build.Revision,
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
		Tables:            qualifiedTables(cfg.Postgres.Tables),
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
	rc.Validate = validate
	dur.apply(&rc)
	r = relay.New(rc, sink, log)
	progress.LagSince = r.LagSince

	// relayCtx ends on SIGTERM/SIGINT, or when the HTTP endpoint fails. The
	// parts that report on the relay (progress, metrics, HTTP) outlive it
	// until the relay has drained, so that they see its final state.
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	var srv *admin.Server
	if cfg.HTTP.Listen != "" {
		srv = admin.New(admin.Config{
			Listen: cfg.HTTP.Listen,
			Ready: func() error {
				switch {
				case relayCtx.Err() != nil:
					return errors.New("shutting down")
				case !stream.Streaming():
					return errors.New("replication is not streaming")
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
			return usageErr("%v; choose a free address for http.listen", err)
		}
	}
	createdSlot, err := cdc.EnsureSlot(setupCtx, conn, cfg.Postgres.Slot, "postgres.slot", cfg.Postgres.FailoverSlot)
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
		store.RunMaintenance(relayCtx, dur.pool, store.MaintainConfig{Tables: qualifiedTables(cfg.Postgres.Tables), MaxAge: cfg.Postgres.Retention},
			time.Hour, log.Named("partitions"))
		return nil
	})

	for _, w := range securityWarnings(cfg) {
		log.Warn(w)
	}
	log.Info("starting", zap.String("version", currentBuild().Version), zap.String("revision", currentBuild().Revision), zap.String("sink", cfg.Sink.Type),
		zap.String("slot", cfg.Postgres.Slot), zap.Strings("tables", cfg.Postgres.Tables))
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

// revision is the VCS revision the binary was built from, or "".
// staticDestinations is the destination every message goes to when the
// sink's template has no placeholder, so that messages_published_total
// exists from the start.
func staticDestinations(cfg config.Config) []string {
	if d, ok := cfg.Sink.Settings().(interface{ StaticDestinations() []string }); ok {
		return d.StaticDestinations()
	}
	return nil
}

// openSink creates the configured sink and checks that its broker answers,
// so that an unreachable broker at start is one clear error. The sink's
// package says how (sinks.Settings.Open).
func openSink(ctx context.Context, cfg config.Config, log *zap.Logger) (relay.Sink, error) {
	return openSinkFor(ctx, cfg, false, log)
}

// openRelaySink is openSink for `run`: the one command whose sink may be
// transactional (sink.kafka.exactly_once). Other commands publish (dlq
// replay) or read outside the relay's position, non-transactionally.
func openRelaySink(ctx context.Context, cfg config.Config, log *zap.Logger) (relay.Sink, error) {
	return openSinkFor(ctx, cfg, true, log)
}

func openSinkFor(ctx context.Context, cfg config.Config, forRelay bool, log *zap.Logger) (relay.Sink, error) {
	set := cfg.Sink.Settings()
	if set == nil {
		return nil, usageErr("sink.type %q is not a registered sink", cfg.Sink.Type)
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
	s, err := set.Open(ctx, log)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return s, nil
}

// certError returns the failed server certificate check inside err, or nil.
func certError(err error) error { return sinks.CertError(err) }

// tlsHint names the settings to check when err is a server certificate
// that did not verify, and is empty otherwise.
func tlsHint(err error, settings string) string {
	if certError(err) != nil {
		return "; the server's TLS certificate did not verify: check " + settings
	}
	return ""
}

// securityWarnings lists settings that work but leave something exposed.
// The relay logs them at start and --check-config prints them.
func securityWarnings(cfg config.Config) []string {
	var ws []string
	if pc, err := pgconn.ParseConfig(cfg.Postgres.URL); err == nil && !loopback(pc.Host) {
		if t := pc.TLSConfig; t == nil || t.InsecureSkipVerify && t.VerifyPeerCertificate == nil {
			ws = append(ws, "postgres.url does not verify the server's certificate; use sslmode=verify-full with sslrootcert=<CA file>")
		}
	}
	if host, _, err := net.SplitHostPort(cfg.HTTP.Listen); err == nil && cfg.HTTP.Token == "" && !loopback(host) {
		ws = append(ws, fmt.Sprintf("http.listen %s is reachable from other hosts and http.token is not set: /status and /metrics are open", cfg.HTTP.Listen))
	}
	if set := cfg.Sink.Settings(); set != nil {
		ws = append(ws, set.Warnings()...)
	}
	return ws
}

// loopback reports whether host (a name, an address or a unix socket
// directory) stays on this machine.
func loopback(host string) bool {
	if host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// qualifiedTables writes each configured table as schema.name.
func qualifiedTables(tables []string) []string {
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		if schema, name, err := cdc.SplitTable(t); err == nil {
			out = append(out, schema+"."+name)
		}
	}
	return out
}
