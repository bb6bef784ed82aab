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
	"slices"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/envelope"
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
	// Columns are the outbox table's column names (postgres.columns): the
	// table is created with them, and its creation time index is on
	// CreatedAt. An empty name is a column the table does not have. The
	// zero value means the relay's own names.
	Columns Columns
}

// Columns names the columns of an outbox table, as postgres.columns does.
type Columns struct {
	ID, AggregateType, AggregateID, EventType, Payload, Headers, Traceparent, SchemaVersion, CreatedAt string
}

// DefaultColumns are the relay's own column names.
var DefaultColumns = Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
	Payload: "payload", Headers: "headers", Traceparent: "traceparent", SchemaVersion: "schema_version", CreatedAt: "created_at"}

// DebeziumColumns are the columns of Debezium's outbox event router table.
var DebeziumColumns = Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type",
	Payload: "payload", Traceparent: "tracingspancontext"}

// definitions returns the column definitions after the id, in the table's
// order, leaving out the columns the mapping does not have.
func (c Columns) definitions() []string {
	var out []string
	for _, d := range []struct{ name, def string }{
		{c.AggregateType, "text        NOT NULL"},
		{c.AggregateID, "text        NOT NULL"},
		{c.EventType, "text        NOT NULL"},
		{c.Payload, "jsonb       NOT NULL"},
		{c.Headers, "jsonb       NOT NULL DEFAULT '{}'"},
		{c.Traceparent, "text        NULL"},
		{c.SchemaVersion, "int         NOT NULL DEFAULT 1"},
		{c.CreatedAt, "timestamptz NOT NULL DEFAULT now()"},
	} {
		if d.name != "" {
			out = append(out, fmt.Sprintf("%-16s %s", pgx.Identifier{d.name}.Sanitize(), d.def))
		}
	}
	return out
}

// required are the columns every outbox table must have, with the setting
// that names each.
func (c Columns) required() [][2]string {
	return [][2]string{{c.ID, "id"}, {c.AggregateType, "aggregate_type"}, {c.AggregateID, "aggregate_id"},
		{c.EventType, "event_type"}, {c.Payload, "payload"}}
}

func (o Options) extraTables() []string {
	if o.Debezium {
		return []string{o.DebeziumTable}
	}
	return nil
}

func (o *Options) setDefaults() {
	if o.Columns == (Columns{}) {
		o.Columns = DefaultColumns
	}
	if o.Table == "" {
		o.Table = "public.outbox"
	}
	if o.Publication == "" {
		o.Publication = "outboxrelay"
	}
	if o.DebeziumTable == "" {
		o.DebeziumTable = "public.outboxevent"
	}
	if o.Debezium {
		t, err1 := qualified(o.Table)
		d, err2 := qualified(o.DebeziumTable)
		if err1 == nil && err2 == nil && t == d {
			// The outbox table is the Debezium table: created once, in
			// Debezium's shape unless Columns name another.
			o.Debezium = false
			if o.Columns == DefaultColumns {
				o.Columns = DebeziumColumns
			}
		}
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

// altIndex names the creation time index of outbox table name when
// outbox_created_at_idx is another table's.
func altIndex(name string) string { return name + "_created_at_idx" }

// sanitizeOptional quotes a column name, leaving "" (no such column) empty.
func sanitizeOptional(column string) string {
	if column == "" {
		return ""
	}
	return pgx.Identifier{column}.Sanitize()
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
	for _, c := range o.Columns.required() {
		if c[0] == "" {
			return "", fmt.Errorf("postgres.columns.%s is empty; every outbox table needs it", c[1])
		}
	}
	if o.Partitioned && o.Columns.CreatedAt == "" {
		return "", fmt.Errorf("--partitioned partitions by the creation time column, and postgres.columns.created_at is empty; map it, or drop --partitioned")
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
		"AltIndex":           pgx.Identifier{altIndex(tname)}.Sanitize(),
		"AltIndexLiteral":    literal(pgx.Identifier{schema, altIndex(tname)}.Sanitize()),
		"ID":                 pgx.Identifier{o.Columns.ID}.Sanitize(),
		"Columns":            o.Columns.definitions(),
		"CreatedAt":          sanitizeOptional(o.Columns.CreatedAt),
		"TableLiteral":       literal(table),
		"Coverage":           cover,
		"Debezium":           o.Debezium,
		"DebeziumTable":      dbz,
		"Publication":        pgx.Identifier{o.Publication}.Sanitize(),
		"PublicationLiteral": literal(o.Publication),
		"EmitInsert":         emitInsert(table, o.Columns),
		"ReservedNames":      reservedArray(false),
		"ReservedPrefixes":   reservedArray(true),
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
	if o.Columns.CreatedAt == "" {
		return "-- No creation time column (postgres.columns.created_at is empty): no retention index.\n", nil
	}
	schema, _, _ := split(o.Table)
	return fmt.Sprintf(`-- Outside a transaction, on an outbox table that existed before: built without blocking
-- inserts. An INVALID index that a failed concurrent build left behind is dropped first
-- (DROP INDEX CONCURRENTLY %[1]s), then built again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_created_at_idx ON %[2]s (%[3]s);
`, pgx.Identifier{schema, "outbox_created_at_idx"}.Sanitize(), table, pgx.Identifier{o.Columns.CreatedAt}.Sanitize()), nil
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
	schema, name, _ := split(o.Table)
	var cols []string
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(attname::text), '{}') FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, table).Scan(&cols)
	if err != nil {
		return fmt.Errorf("read the columns of %s.%s: %w", schema, name, err)
	}
	for _, c := range o.Columns.required() {
		if !slices.Contains(cols, c[0]) {
			return fmt.Errorf("outbox table %s.%s has no column %q (postgres.columns.%s); map postgres.columns to its columns and run `outboxrelay migrate --config FILE` (see docs/debezium.md)", schema, name, c[0], c[1])
		}
	}
	if o.Columns.CreatedAt == "" {
		return nil // no creation time: retention and time windows have nothing to index
	}
	if !slices.Contains(cols, o.Columns.CreatedAt) {
		return fmt.Errorf("outbox table %s.%s has no column %q (postgres.columns.created_at); map it to the table's creation time column, or set it to \"\" when there is none, and run `outboxrelay migrate --config FILE`", schema, name, o.Columns.CreatedAt)
	}
	column := pgx.Identifier{o.Columns.CreatedAt}.Sanitize()
	bare := "outbox_created_at_idx"
	index := pgx.Identifier{schema, bare}.Sanitize()
	// Index names are per schema: the name the index always had may belong
	// to another outbox table's index there.
	var taken bool
	err = conn.QueryRow(ctx, `SELECT coalesce((SELECT i.indrelid <> to_regclass($2) FROM pg_index i WHERE i.indexrelid = to_regclass($1)), false)`,
		index, table).Scan(&taken)
	if err != nil {
		return fmt.Errorf("look up index %s: %w", index, err)
	}
	if taken {
		bare = altIndex(name)
		index = pgx.Identifier{schema, bare}.Sanitize()
	}
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
		_, err = conn.Exec(ctx, fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (%s)", pgx.Identifier{bare}.Sanitize(), table, column))
		if err != nil {
			return fmt.Errorf("create index %s concurrently: %w; run migrate again to retry (it drops the INVALID index this left)", index, err)
		}
		// IF NOT EXISTS also skips an index another migrate began building
		// meanwhile: look again.
	}
}

// emitInsert is the statement outboxrelay.emit writes the row with, into
// the columns the mapping has; headers or a traceparent for a table without
// their column are an error.
func emitInsert(table string, c Columns) string {
	cols := []string{c.AggregateType, c.AggregateID, c.EventType, c.Payload}
	vals := []string{"emit.aggregate_type", "emit.aggregate_id", "emit.event_type", "emit.payload"}
	var checks string
	for _, o := range []struct{ col, val, key string }{{c.Headers, "emit.headers", "headers"}, {c.Traceparent, "emit.traceparent", "traceparent"}} {
		if o.col != "" {
			cols, vals = append(cols, o.col), append(vals, o.val)
			continue
		}
		cond := "emit.traceparent IS NOT NULL"
		if o.key == "headers" {
			cond = "emit.headers <> '{}'"
		}
		checks += fmt.Sprintf("IF %s THEN\n        RAISE EXCEPTION 'outboxrelay.emit: the outbox table %%s has no %s column (postgres.columns.%s)', %s USING ERRCODE = '22023';\n    END IF;\n    ",
			cond, o.key, o.key, literal(table))
	}
	for i, col := range cols {
		cols[i] = pgx.Identifier{col}.Sanitize()
	}
	return fmt.Sprintf("%sINSERT INTO %s (%s) VALUES (%s) RETURNING %s INTO new_id;", checks, table,
		strings.Join(cols, ", "), strings.Join(vals, ", "), pgx.Identifier{c.ID}.Sanitize())
}

// reservedArray is the SQL text[] of the reserved header names, or of the
// reserved prefixes, in lower case: envelope's rule, so the function and
// the relay agree.
func reservedArray(prefixes bool) string {
	var out []string
	for _, f := range envelope.ReservedForms() {
		if p, ok := strings.CutSuffix(f, "*"); ok == prefixes {
			out = append(out, literal(p))
		}
	}
	return "ARRAY[" + strings.Join(out, ", ") + "]::text[]"
}
