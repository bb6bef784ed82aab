// Package migrations holds the SQL that prepares a database for
// outboxrelay, embedded in the binary: the default outbox table, the
// outboxrelay schema (checkpoint, dead letters, status view) and the
// publication. Every statement is idempotent.
package migrations

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/*.sql
var files embed.FS

// Options choose the names the SQL uses.
type Options struct {
	// Table is the outbox table as schema.name (default public.outbox).
	Table string
	// Publication is the publication name (default outboxrelay).
	Publication string
	// Debezium also creates a Debezium-shaped outbox table.
	Debezium bool
	// DebeziumTable is its name (default public.outboxevent).
	DebeziumTable string
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

func qualified(t string) (string, error) {
	schema, name, ok := strings.Cut(t, ".")
	if !ok {
		schema, name = "public", t
	}
	if schema == "" || name == "" || strings.Contains(name, ".") {
		return "", fmt.Errorf("table %q must be schema.table", t)
	}
	return pgx.Identifier{schema, name}.Sanitize(), nil
}

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
	data := map[string]any{
		"Table":              table,
		"Debezium":           o.Debezium,
		"DebeziumTable":      dbz,
		"Publication":        pgx.Identifier{o.Publication}.Sanitize(),
		"PublicationLiteral": "'" + strings.ReplaceAll(o.Publication, "'", "''") + "'",
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
		tmpl, err := template.New(name).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", name, err)
		}
		if err := tmpl.Execute(&out, data); err != nil {
			return "", fmt.Errorf("render %s: %w", name, err)
		}
	}
	return out.String(), nil
}

// Apply runs the migrations in one transaction, serialised with an advisory
// lock so that concurrent runs do not race. Running it again changes nothing.
func Apply(ctx context.Context, conn *pgx.Conn, o Options) error {
	sql, err := Render(o)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('outboxrelay.migrate'))"); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	// Simple protocol: the script holds several statements.
	if _, err := tx.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return tx.Commit(ctx)
}
