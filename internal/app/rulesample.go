package app

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/replay"
)

// OutboxSource is cfg's outbox tables (postgres.tables) in database, whose
// rows replay, recover, verify and a first start read back and build as
// the relay does.
func OutboxSource(cfg config.Config, database string) replay.Source {
	return replay.Source{
		Tables: QualifiedTables(cfg.Postgres.Tables), Columns: cfg.Postgres.Columns, Database: database,
		HeaderColumns: cfg.Postgres.HeaderColumns, EnvelopeColumns: cfg.Postgres.EnvelopeColumns,
		Format: cfg.Envelope.Format, CloudEventsSource: cfg.Envelope.CloudEventsSource, Rules: cfg.Config,
	}
}

// NewestRuleRows calls fn with what the routing rules see of each of the
// newest n rows of cfg's outbox tables (replay.Filter.Newest), in commit
// order, and the reason the relay dead-letters the row before any rule
// runs: `outboxrelay rules test --from-table`. The rows are read in a
// read-only transaction: nothing is written, no slot is read or confirmed.
func NewestRuleRows(ctx context.Context, cfg config.Config, n int, fn func(row *rules.Row, invalid error) error) error {
	conn, err := Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("query PostgreSQL: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var database string
	if err := tx.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		return fmt.Errorf("query PostgreSQL: %w", err)
	}
	return OutboxSource(cfg, database).RuleRows(ctx, tx, replay.Filter{Newest: n}, fn)
}
