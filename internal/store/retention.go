package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// RetentionConfig says which outbox rows Retention deletes.
type RetentionConfig struct {
	// Tables are the outbox tables, schema.table.
	Tables []string
	// Column is the row's creation time column (postgres.columns.created_at).
	Column string
	// MaxAge: rows older than this are deleted; 0 disables retention.
	MaxAge time.Duration
	// Interval between runs (default 1m) and rows per DELETE (default 10000).
	Interval time.Duration
	Batch    int
}

// Retention deletes outbox rows older than cfg.MaxAge, every cfg.Interval,
// in batches so that no statement holds locks or builds WAL for long.
//
// Deleting a row never loses its message, published or not: the relay
// publishes from the WAL, which holds the whole inserted row and is kept
// by the slot until the relay confirms it, and it ignores deletes. The
// rows only serve inspection; retention bounds the table for operators
// who do not use the insert-then-delete pattern.
//
// It runs until ctx is done; failures are logged and retried at the next
// tick.
func Retention(ctx context.Context, db DB, cfg RetentionConfig, log *zap.Logger) error {
	if cfg.MaxAge <= 0 || cfg.Column == "" {
		return nil
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 10000
	}
	stmts := make(map[string]string, len(cfg.Tables))
	for _, t := range cfg.Tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return err
		}
		var partitioned bool
		err = db.QueryRow(ctx, `SELECT coalesce((SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2), false)`, schema, name).Scan(&partitioned)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("inspect %s: %w", t, err)
		}
		if partitioned {
			// ctid is not unique across partitions; partitioned tables are
			// retained by dropping whole partitions (Maintain).
			log.Info("retention drops whole daily partitions of this partitioned table", zap.String("table", t))
			continue
		}
		ident := pgx.Identifier{schema, name}.Sanitize()
		col := pgx.Identifier{cfg.Column}.Sanitize()
		// ctid batches: DELETE has no LIMIT. The index on the column (see
		// migrations) keeps the inner scan cheap.
		stmts[t] = fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM %[1]s WHERE %[2]s < now() - make_interval(secs => $1) LIMIT $2))`, ident, col)
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		for table, stmt := range stmts {
			var deleted int64
			for ctx.Err() == nil {
				tag, err := db.Exec(ctx, stmt, cfg.MaxAge.Seconds(), cfg.Batch)
				if err != nil {
					if ctx.Err() == nil {
						log.Warn("retention delete failed", zap.String("table", table), zap.Error(err))
					}
					break
				}
				deleted += tag.RowsAffected()
				if tag.RowsAffected() < int64(cfg.Batch) {
					break
				}
			}
			if deleted > 0 {
				log.Info("retention deleted rows", zap.String("table", table), zap.Int64("rows", deleted))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
