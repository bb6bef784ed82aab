package app

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/relay"
)

// durability holds the parts of the relay that keep state in PostgreSQL:
// the checkpoint record, dead letters and the idle-slot heartbeat.
type durability struct {
	pool *pgxpool.Pool
	cfg  config.Config
	log  *zap.Logger
}

func openDurability(ctx context.Context, cfg config.Config, log *zap.Logger) (*durability, error) {
	pcfg, err := poolConfig(cfg.Postgres.URL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL: %v%s", err, tlsHint(err))
	}
	return &durability{pool: pool, cfg: cfg, log: log}, nil
}

// poolConfig is the pool configuration of url, its sessions named as the
// replication connection is, so that an operator looking at
// pg_stat_activity sees which sessions are the relay's.
func poolConfig(url string) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("invalid PostgreSQL URL: %v", err)
	}
	if _, set := pcfg.ConnConfig.RuntimeParams["application_name"]; !set {
		pcfg.ConnConfig.RuntimeParams["application_name"] = "outboxrelay"
	}
	return pcfg, nil
}

// options returns the relay's checkpoint and, with relay.dead_letters,
// its dead-letter and parking store.
func (d *durability) options() relay.Options {
	opts := relay.Options{Checkpoint: newStartWindow(store.Checkpoint{DB: d.pool, Slot: d.cfg.Postgres.Slot}, d.log)}
	if d.cfg.Relay.DeadLetters {
		dead := &store.DeadLetters{DB: d.pool, Slot: d.cfg.Postgres.Slot}
		opts.DeadLetters, opts.Parking = dead, dead
	}
	if d.spills() {
		opts.Spill = store.Spill{DB: d.pool, Slot: d.cfg.Postgres.Slot}
	}
	return opts
}

// spills reports whether a sink that falls behind stores its messages in
// outboxrelay.spilled: with several sinks and relay.behind: spill.
func (d *durability) spills() bool { return spills(d.cfg) }

func spills(cfg config.Config) bool {
	return len(cfg.SinkList()) > 1 && cfg.Relay.Behind == relay.BehindSpill
}

// spillReady checks that outboxrelay.spilled is there when the relay
// spills, and that it holds nothing of the slot that this configuration
// would not read back: messages of a sink it lost, or of any sink when it
// does not spill (one sink, or relay.behind: hold).
func (d *durability) spillReady(ctx context.Context) error {
	var names []string
	if d.spills() {
		for _, ns := range d.cfg.SinkList() {
			names = append(names, ns.Name)
		}
	}
	return store.SpillReady(ctx, d.pool, d.cfg.Postgres.Slot, d.spills(), names)
}

// consumer records how the slot is consumed (cdc.Setup has compared it
// with the record), registers the tables with the coverage trigger and
// returns the guard that keeps checking coverage.
func (d *durability) consumer(ctx context.Context) (*cdc.Guard, error) {
	pg := d.cfg.Postgres
	tables := QualifiedTables(pg.Tables)
	state, err := cdc.ReadCoverage(ctx, d.pool, pg.Publication, tables)
	if err != nil {
		return nil, err
	}
	if p := state.Problems(); len(p) > 0 {
		return nil, &cdc.CoverageError{Problems: p}
	}
	cp := store.Checkpoint{DB: d.pool, Slot: pg.Slot}
	cur := cdc.Consumer{Publication: pg.Publication, Tables: tables, Relations: state.Tables}
	if err := cp.RecordConsumer(ctx, cur); err != nil {
		return nil, err
	}
	for _, t := range tables {
		if err := store.RegisterCoverage(ctx, d.pool, pg.Publication, t); err != nil {
			d.log.Warn("cannot register the table with the coverage trigger; run `outboxrelay migrate` for it as the schema owner", zap.String("table", t), zap.Error(err))
		}
	}
	if !state.Guarded {
		d.log.Warn("the coverage event trigger is not installed or disabled: a table swap or ALTER PUBLICATION is found only by the periodic check (postgres.coverage_interval), after inserts may have been missed; run `outboxrelay migrate` as a superuser to install it")
	}
	return cdc.NewGuard(d.pool, cp, cdc.GuardConfig{
		Publication: pg.Publication, Tables: tables, Ignored: QualifiedTables(pg.IgnoreTables), Interval: pg.CoverageInterval,
	}, state.Tables, d.log), nil
}

// heartbeat runs the idle-slot heartbeat until ctx is done.
func (d *durability) heartbeat(ctx context.Context) error {
	if err := cdc.Heartbeat(ctx, d.pool, d.cfg.Postgres.HeartbeatInterval, d.log.Named("heartbeat")); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// retention deletes old outbox rows until ctx is done, when configured.
func (d *durability) retention(ctx context.Context) error {
	return store.Retention(ctx, d.pool, store.RetentionConfig{
		Tables: d.cfg.Postgres.Tables,
		Column: d.cfg.Postgres.Columns.CreatedAt,
		MaxAge: d.cfg.Postgres.Retention,
	}, d.log.Named("retention"))
}

func (d *durability) close() { d.pool.Close() }
