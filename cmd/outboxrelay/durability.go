package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/config"
	"github.com/outboxrelay/outboxrelay/dlq"
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
	pcfg, err := pgxpool.ParseConfig(cfg.Postgres.URL)
	if err != nil {
		return nil, usageErr("invalid PostgreSQL URL: %v", err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, usageErr("cannot connect to PostgreSQL: %v%s", err, tlsHint(err, "sslrootcert and sslmode in postgres.url"))
	}
	return &durability{pool: pool, cfg: cfg, log: log}, nil
}

// apply sets the relay's checkpoint, verification and dead-letter hooks.
func (d *durability) apply(rc *relay.Config) {
	cp := cdc.Checkpoints{DB: d.pool, Slot: d.cfg.Postgres.Slot}
	rc.Checkpoint = cp.Save
	rc.Verify = cp.Verify
	if d.cfg.Relay.DeadLetters {
		store := &dlq.Store{DB: d.pool, Slot: d.cfg.Postgres.Slot}
		rc.DeadLetter = store.Add
	}
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
	return cdc.Retention(ctx, d.pool, cdc.RetentionConfig{
		Tables: d.cfg.Postgres.Tables,
		Column: d.cfg.Postgres.Columns.CreatedAt,
		MaxAge: d.cfg.Postgres.Retention,
	}, d.log.Named("retention"))
}

func (d *durability) close() { d.pool.Close() }
