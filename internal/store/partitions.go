package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// Partitioned outbox tables are range-partitioned by their creation time
// column into daily partitions named <table>_pYYYYMMDD (UTC), plus a
// default partition so that an insert never fails for want of a partition.
// Maintenance creates the partitions ahead of time and, with a retention,
// detaches and drops whole partitions past it: no DELETE, no bloat.

// PartitionAhead is how many days of partitions maintenance keeps ready.
const PartitionAhead = 7

// partitionName is <table>_pYYYYMMDD.
func partitionName(table string, day time.Time) string {
	return fmt.Sprintf("%s_p%s", table, day.UTC().Format("20060102"))
}

var dailyRE = regexp.MustCompile(`_p(\d{8})$`)

// MaintainConfig says which tables Maintain looks after.
type MaintainConfig struct {
	// Tables are the outbox tables, schema.table. Tables that are not
	// partitioned are left alone.
	Tables []string
	// MaxAge: daily partitions whose whole day is older than this are
	// dropped; 0 keeps every partition.
	MaxAge time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Maintain creates the daily partitions of every partitioned outbox table
// for today and the next PartitionAhead days, and drops the daily
// partitions that ended before now - MaxAge. Dropping detaches the
// partition first, CONCURRENTLY when PostgreSQL allows it (not while a
// default partition exists), so producers' inserts wait on it little.
// Each lock is bounded by lock_timeout; a partition that cannot be dropped
// now is left for the next run. It returns what it did, a line each.
func Maintain(ctx context.Context, pool *pgxpool.Pool, cfg MaintainConfig) ([]string, error) {
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	var done []string
	for _, t := range cfg.Tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return done, &cdc.SetupError{Msg: err.Error()}
		}
		var partitioned bool
		err = pool.QueryRow(ctx, `SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2`, schema, name).Scan(&partitioned)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && !partitioned) {
			continue
		}
		if err != nil {
			return done, fmt.Errorf("inspect %s: %w", t, err)
		}
		parent := pgx.Identifier{schema, name}.Sanitize()
		today := now().UTC().Truncate(24 * time.Hour)
		for d := 0; d <= PartitionAhead; d++ {
			day := today.AddDate(0, 0, d)
			part := partitionName(name, day)
			var exists bool
			if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, part}.Sanitize()).Scan(&exists); err != nil {
				return done, fmt.Errorf("look for partition %s: %w", part, err)
			}
			if exists {
				continue
			}
			stmt := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
				pgx.Identifier{schema, part}.Sanitize(), parent, day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))
			if err := execLocked(ctx, pool, stmt); err != nil {
				return done, fmt.Errorf("create partition %s.%s: %w", schema, part, err)
			}
			done = append(done, fmt.Sprintf("created partition %s.%s", schema, part))
		}
		if cfg.MaxAge <= 0 {
			continue
		}
		rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = $1::regclass ORDER BY 1`, parent)
		if err != nil {
			return done, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return done, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		cutoff := now().Add(-cfg.MaxAge)
		trimmed, err := trimDefault(ctx, pool, parent, cutoff)
		if err != nil {
			return done, err
		}
		if trimmed != "" {
			done = append(done, trimmed)
		}
		for _, part := range parts {
			m := dailyRE.FindStringSubmatch(part)
			if m == nil || !strings.HasPrefix(part, name+"_p") {
				continue // not one of ours
			}
			day, err := time.Parse("20060102", m[1])
			if err != nil || day.AddDate(0, 0, 1).After(cutoff) {
				continue
			}
			ident := pgx.Identifier{schema, part}.Sanitize()
			// Not in a transaction: DETACH ... CONCURRENTLY refuses one.
			err = execLocked(ctx, pool, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", parent, ident))
			if pgCode(err, "55000") {
				// PostgreSQL refuses CONCURRENTLY while a default partition
				// exists; a plain detach holds the parent's lock briefly,
				// bounded by lock_timeout.
				err = execLocked(ctx, pool, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", parent, ident))
			}
			if err != nil {
				return done, fmt.Errorf("detach partition %s.%s: %w", schema, part, err)
			}
			if err := execLocked(ctx, pool, "DROP TABLE "+ident); err != nil {
				return done, fmt.Errorf("drop partition %s.%s: %w", schema, part, err)
			}
			done = append(done, fmt.Sprintf("dropped partition %s.%s (retention %s)", schema, part, cfg.MaxAge))
		}
	}
	return done, nil
}

// trimDefault deletes the rows of parent's default partition created before
// cutoff, in batches: no daily partition holds them, so no drop ever would.
// It returns what it did, or "" when there was nothing to delete.
func trimDefault(ctx context.Context, pool *pgxpool.Pool, parent string, cutoff time.Time) (string, error) {
	var def, column *string
	err := pool.QueryRow(ctx, `SELECT (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p.partdefid),
			(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = p.partrelid AND a.attnum = p.partattrs[0])
		FROM pg_partitioned_table p WHERE p.partrelid = $1::regclass`, parent).Scan(&def, &column)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (def == nil || column == nil)) {
		return "", nil // no default partition, or a partition key that is an expression
	}
	if err != nil {
		return "", fmt.Errorf("look up the default partition of %s: %w", parent, err)
	}
	// ctid is unique within the one partition.
	stmt := fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM %[1]s WHERE %[2]s < $1 LIMIT 10000))`,
		*def, pgx.Identifier{*column}.Sanitize())
	var deleted int64
	for {
		tag, err := pool.Exec(ctx, stmt, cutoff)
		if err != nil {
			return "", fmt.Errorf("delete old rows of the default partition %s: %w", *def, err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < 10000 {
			break
		}
	}
	if deleted == 0 {
		return "", nil
	}
	return fmt.Sprintf("deleted %d rows created before %s from the default partition %s (retention)", deleted, cutoff.UTC().Format(time.RFC3339), *def), nil
}

// execLocked runs stmt on its own connection with a lock_timeout, so that
// maintenance gives up rather than queue the producers' inserts behind it.
func execLocked(ctx context.Context, pool *pgxpool.Pool, stmt string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET lock_timeout = '2s'"); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, stmt)
	if _, rerr := conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout"); rerr != nil {
		conn.Conn().Close(context.WithoutCancel(ctx)) // the pool drops a closed connection
	}
	return err
}

// RunMaintenance runs Maintain every interval (default 1h) until ctx is
// done; failures are logged and retried at the next run.
func RunMaintenance(ctx context.Context, pool *pgxpool.Pool, cfg MaintainConfig, interval time.Duration, log *zap.Logger) {
	if interval <= 0 {
		interval = time.Hour
	}
	for {
		done, err := Maintain(ctx, pool, cfg)
		for _, d := range done {
			log.Info(d)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("partition maintenance failed; retrying later", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// pgCode reports whether err is a PostgreSQL error with SQLSTATE code.
func pgCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
