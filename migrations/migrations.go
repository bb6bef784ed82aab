// Package migrations holds the SQL that prepares a database for
// outboxrelay, embedded in the binary: the default outbox table, the
// outboxrelay schema (checkpoint, dead letters, status view) and the
// publication. Every statement is idempotent.
package migrations

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed sql/*.sql
var files embed.FS

// Options choose the names the SQL uses.
type Options struct {
	// Table is the outbox table as schema.name (default public.outbox).
	Table string
	// Publication is the publication name (default outboxrelay).
	Publication string
	// Partitioned creates the outbox table range-partitioned by created_at
	// (daily partitions, see Maintain in internal/store) with a default partition.
	Partitioned bool
	// Debezium also creates a Debezium-shaped outbox table.
	Debezium bool
	// DebeziumTable is its name (default public.outboxevent).
	DebeziumTable string
}

func (o Options) extraTables() []string {
	if o.Debezium {
		return []string{o.DebeziumTable}
	}
	return nil
}

func (o *Options) setDefaults() {
	if o.Table == "" {
		o.Table = "public.outbox"
	}
	if o.Publication == "" {
		o.Publication = "outboxrelay"
	}
	if o.DebeziumTable == "" {
		o.DebeziumTable = "public.outboxevent"
	}
}

func split(t string) (schema, name string, err error) {
	schema, name, ok := strings.Cut(t, ".")
	if !ok {
		schema, name = "public", t
	}
	if schema == "" || name == "" || strings.Contains(name, ".") {
		return "", "", fmt.Errorf("table %q must be schema.table", t)
	}
	return schema, name, nil
}

func qualified(t string) (string, error) {
	schema, name, err := split(t)
	if err != nil {
		return "", err
	}
	return pgx.Identifier{schema, name}.Sanitize(), nil
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// guarded is an outbox table the coverage guard keeps in the publication.
type guarded struct{ Schema, Name string } // SQL literals

// addColumn adds a column only when the catalog lacks it, so that a rerun
// takes no lock on the table.
const addColumn = `{{define "addColumn"}}DO $outboxrelay$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{{index . 0}}'::regclass AND attname = '{{index . 1}}' AND NOT attisdropped) THEN
        ALTER TABLE {{index . 0}} ADD COLUMN {{index . 1}} {{index . 2}};
    END IF;
END
$outboxrelay$;{{end}}`

// Render returns the SQL that Apply runs.
func Render(o Options) (string, error) {
	o.setDefaults()
	table, err := qualified(o.Table)
	if err != nil {
		return "", err
	}
	dbz, err := qualified(o.DebeziumTable)
	if err != nil {
		return "", err
	}
	schema, tname, _ := split(o.Table)
	var cover []guarded
	for _, t := range append([]string{o.Table}, o.extraTables()...) {
		s, n, _ := split(t)
		cover = append(cover, guarded{literal(s), literal(n)})
	}
	data := map[string]any{
		"Table":              table,
		"Partitioned":        o.Partitioned,
		"DefaultPartition":   pgx.Identifier{schema, tname + "_default"}.Sanitize(),
		"IndexLiteral":       literal(pgx.Identifier{schema, "outbox_created_at_idx"}.Sanitize()),
		"TableLiteral":       literal(table),
		"Coverage":           cover,
		"Debezium":           o.Debezium,
		"DebeziumTable":      dbz,
		"Publication":        pgx.Identifier{o.Publication}.Sanitize(),
		"PublicationLiteral": literal(o.Publication),
	}
	names, err := fs.Glob(files, "sql/*.sql")
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	var out bytes.Buffer
	for _, name := range names {
		src, err := files.ReadFile(name)
		if err != nil {
			return "", err
		}
		tmpl, err := template.New(name).Option("missingkey=error").Funcs(template.FuncMap{
			"args": func(a ...string) []string { return a },
		}).Parse(addColumn)
		if err == nil {
			_, err = tmpl.Parse(string(src))
		}
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", name, err)
		}
		if err := tmpl.Execute(&out, data); err != nil {
			return "", fmt.Errorf("render %s: %w", name, err)
		}
	}
	return out.String(), nil
}

// LockTimeout bounds how long a migration waits for a lock. A rerun takes
// no strong lock (every change is made only when the catalog lacks it); a
// first run that must wait longer fails with lock_not_available rather than
// queue the service's inserts and the relay's checkpoint writes behind it.
const LockTimeout = 5 * time.Second

// Apply runs the migrations in one transaction, serialised with an advisory
// lock so that concurrent runs do not race, then, outside it, builds the
// indexes an existing outbox table lacks with CREATE INDEX CONCURRENTLY,
// which PostgreSQL refuses in a transaction and which does not block the
// service's inserts. Running it again changes nothing and takes no lock
// stronger than ACCESS SHARE on the outbox and relay tables. When a lock is
// not granted within LockTimeout it retries a few times, then fails with an
// error that says what to do.
func Apply(ctx context.Context, conn *pgx.Conn, o Options) error {
	sql, err := Render(o)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = apply(ctx, conn, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
			if err != nil {
				return err
			}
			return retentionIndex(ctx, conn, o)
		}
		if attempt == 3 {
			return fmt.Errorf("%w; another session holds a lock on a table the migration changes: retry when it is done (see pg_locks)", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * time.Second):
		}
	}
}

func apply(ctx context.Context, conn *pgx.Conn, sql string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) // after Commit this is a no-op
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d; SET LOCAL outboxrelay.migrating = on", LockTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('outboxrelay.migrate'))"); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	// Simple protocol: the script holds several statements.
	if _, err := tx.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return tx.Commit(ctx)
}

// ConcurrentSQL is the SQL that Apply runs after the migration transaction
// when the outbox table already existed; `migrate --print` shows it.
func ConcurrentSQL(o Options) (string, error) {
	o.setDefaults()
	table, err := qualified(o.Table)
	if err != nil {
		return "", err
	}
	schema, _, _ := split(o.Table)
	return fmt.Sprintf(`-- Outside a transaction, on an outbox table that existed before: built without blocking
-- inserts. An INVALID index that a failed concurrent build left behind is dropped first
-- (DROP INDEX CONCURRENTLY %[1]s), then built again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_created_at_idx ON %[2]s (created_at);
`, pgx.Identifier{schema, "outbox_created_at_idx"}.Sanitize(), table), nil
}

// retentionIndex builds the created_at index of an existing, unpartitioned
// outbox table with CREATE INDEX CONCURRENTLY, outside any transaction. An
// index that is already valid is left alone (no lock is taken); an INVALID
// one, left by a concurrent build that failed or was cancelled, is dropped
// concurrently and built again. A partitioned table is skipped: PostgreSQL
// cannot build its index concurrently, and its retention drops partitions
// instead of deleting rows.
func retentionIndex(ctx context.Context, conn *pgx.Conn, o Options) error {
	o.setDefaults()
	table, err := qualified(o.Table)
	if err != nil {
		return err
	}
	schema, _, _ := split(o.Table)
	index := pgx.Identifier{schema, "outbox_created_at_idx"}.Sanitize()
	for {
		var kind string
		var valid *bool
		var building bool
		err := conn.QueryRow(ctx, `SELECT c.relkind::text, (SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($2)),
				EXISTS (SELECT FROM pg_stat_progress_create_index p WHERE p.relid = c.oid)
			FROM pg_class c WHERE c.oid = to_regclass($1)`, table, index).Scan(&kind, &valid, &building)
		if errors.Is(err, pgx.ErrNoRows) || kind == "p" {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up index %s: %w", index, err)
		}
		switch {
		case valid != nil && *valid:
			return nil
		case building:
			// Another migrate is building it (INVALID until it is done).
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		case valid != nil:
			if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+index); err != nil {
				return fmt.Errorf("drop invalid index %s: %w", index, err)
			}
		}
		_, err = conn.Exec(ctx, fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_created_at_idx ON %s (created_at)", table))
		if err != nil {
			return fmt.Errorf("create index %s concurrently: %w; run migrate again to retry (it drops the INVALID index this left)", index, err)
		}
		// IF NOT EXISTS also skips an index another migrate began building
		// meanwhile: look again.
	}
}
