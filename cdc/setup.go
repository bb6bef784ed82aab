package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Setup checks that PostgreSQL can feed the relay and creates what is
// missing: the publication (inserts only, limited to the outbox tables) and
// the logical replication slot. It is idempotent and safe to run from
// several relays at once. Problems an operator must fix come back as
// *SetupError with one sentence naming the fix.
func Setup(ctx context.Context, conn *pgx.Conn, cfg Config, requiredColumns []string) error {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return &SetupError{Msg: fmt.Sprintf("wal_level is %s; set wal_level=logical and restart PostgreSQL", walLevel)}
	}
	if v := conn.PgConn().ParameterStatus("server_version_num"); v != "" && v < "140000" && len(v) == 6 {
		return &SetupError{Msg: fmt.Sprintf("PostgreSQL %s is too old; outboxrelay needs PostgreSQL 14 or later", conn.PgConn().ParameterStatus("server_version"))}
	}

	var role string
	var canReplicate bool
	if err := conn.QueryRow(ctx, `SELECT rolname, rolreplication OR rolsuper OR EXISTS (
			SELECT 1 FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'member'))
		FROM pg_roles WHERE rolname = current_user`).Scan(&role, &canReplicate); err != nil {
		return fmt.Errorf("read role attributes: %w", err)
	}
	if !canReplicate {
		return &SetupError{Msg: fmt.Sprintf("role %s lacks the REPLICATION privilege; run: ALTER ROLE %s REPLICATION", role, displayIdent(role))}
	}

	for _, t := range cfg.Tables {
		schema, name, err := SplitTable(t)
		if err != nil {
			return &SetupError{Msg: err.Error()}
		}
		var cols []string
		err = conn.QueryRow(ctx, `
			SELECT coalesce(array_agg(a.attname::text), '{}')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
			WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
			GROUP BY c.oid`, schema, name).Scan(&cols)
		if errors.Is(err, pgx.ErrNoRows) {
			return &SetupError{Msg: fmt.Sprintf("outbox table %s.%s does not exist; run `outboxrelay migrate` or fix postgres.tables", schema, name)}
		}
		if err != nil {
			return fmt.Errorf("inspect table %s.%s: %w", schema, name, err)
		}
		for _, want := range requiredColumns {
			if !contains(cols, want) {
				return &SetupError{Msg: fmt.Sprintf("outbox table %s.%s has no column %q; add it or map it in postgres.columns", schema, name, want)}
			}
		}
	}

	var schema bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('outboxrelay.checkpoint') IS NOT NULL").Scan(&schema); err != nil {
		return fmt.Errorf("look for the outboxrelay schema: %w", err)
	}
	if !schema {
		return &SetupError{Msg: "schema outboxrelay is missing; run `outboxrelay migrate --database-url URL` first"}
	}

	if err := ensurePublication(ctx, conn, cfg); err != nil {
		return err
	}
	return EnsureSlot(ctx, conn, cfg.Slot)
}

func ensurePublication(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	var idents []string
	for _, t := range cfg.Tables {
		schema, name, _ := SplitTable(t)
		idents = append(idents, pgx.Identifier{schema, name}.Sanitize())
	}
	if !exists {
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
			pgx.Identifier{cfg.Publication}.Sanitize(), strings.Join(idents, ", ")))
		if err != nil && !isCode(err, "42710") { // duplicate_object: another relay won the race
			return privilegeHint(fmt.Errorf("create publication %s: %w", cfg.Publication, err), "CREATE on the database, and ownership of the outbox tables")
		}
		return nil
	}
	rows, err := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1", cfg.Publication)
	if err != nil {
		return fmt.Errorf("read publication tables: %w", err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read publication tables: %w", err)
	}
	for i, t := range cfg.Tables {
		schema, name, _ := SplitTable(t)
		if contains(have, schema+"."+name) {
			continue
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pgx.Identifier{cfg.Publication}.Sanitize(), idents[i]))
		if err != nil && !isCode(err, "42710") {
			return privilegeHint(fmt.Errorf("add %s.%s to publication %s: %w", schema, name, cfg.Publication, err), "ownership of the publication and of the table")
		}
	}
	return nil
}

// EnsureSlot creates the logical replication slot (pgoutput) if it is missing
// and checks an existing one. From its creation on, every committed outbox
// row is kept for the relay, even before the relay first runs.
func EnsureSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	var plugin, walStatus string
	var database *string
	err := conn.QueryRow(ctx, "SELECT coalesce(plugin, ''), coalesce(wal_status, ''), database FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&plugin, &walStatus, &database)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		_, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
		if err != nil && !isCode(err, "42710") {
			return privilegeHint(fmt.Errorf("create replication slot %s: %w", slot, err), "the REPLICATION attribute")
		}
		return nil
	case err != nil:
		return fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	if plugin != "pgoutput" {
		return &SetupError{Msg: fmt.Sprintf("replication slot %s uses plugin %q; drop it or choose another postgres.slot (outboxrelay needs pgoutput)", slot, plugin)}
	}
	var current string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&current); err != nil {
		return fmt.Errorf("read current database: %w", err)
	}
	if database == nil || *database != current {
		return &SetupError{Msg: fmt.Sprintf("replication slot %s belongs to another database; choose another postgres.slot", slot)}
	}
	if walStatus == "lost" {
		return &SetupError{Msg: fmt.Sprintf("replication slot %s has wal_status=lost: PostgreSQL removed WAL it still needed (max_slot_wal_keep_size); drop and re-create the slot, republish what was missed from the outbox table, then delete its row in outboxrelay.checkpoint", slot)}
	}
	return nil
}

// Privileges names the optional parts of the relay that write to
// PostgreSQL, so that CheckPrivileges asks only for what will be used.
type Privileges struct {
	// DeadLetters: the relay inserts into outboxrelay.dead_letters.
	DeadLetters bool
	// Heartbeat: the relay calls pg_logical_emit_message.
	Heartbeat bool
	// Retention lists the outbox tables (schema.name) the relay deletes
	// old rows from.
	Retention []string
}

// CheckPrivileges checks that the connected role can do what the relay
// does besides streaming: record its checkpoint (SELECT, INSERT, UPDATE on
// outboxrelay.checkpoint) and, as p says, store dead letters, send
// heartbeats and delete old outbox rows. Run it after Setup, which checks
// that the schema exists. A missing privilege comes back as *SetupError
// with the exact GRANT statements to run, so that the relay fails at start
// instead of at its first checkpoint or dead letter.
func CheckPrivileges(ctx context.Context, conn *pgx.Conn, p Privileges) error {
	var role string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		return fmt.Errorf("read role: %w", err)
	}
	r := displayIdent(role)
	var grants []string
	need := func(ok bool, grant string) {
		if !ok {
			grants = append(grants, grant+" TO "+r)
		}
	}

	var usage bool
	if err := conn.QueryRow(ctx, "SELECT has_schema_privilege('outboxrelay', 'USAGE')").Scan(&usage); err != nil {
		return fmt.Errorf("check privileges on schema outboxrelay: %w", err)
	}
	need(usage, "GRANT USAGE ON SCHEMA outboxrelay")
	type tablePrivileges struct {
		name  string // sanitized
		privs []string
	}
	tables := []tablePrivileges{{"outboxrelay.checkpoint", []string{"SELECT", "INSERT", "UPDATE"}}}
	if p.DeadLetters {
		tables = append(tables, tablePrivileges{"outboxrelay.dead_letters", []string{"INSERT"}})
	}
	for _, t := range p.Retention {
		schema, name, err := SplitTable(t)
		if err != nil {
			return &SetupError{Msg: err.Error()}
		}
		tables = append(tables, tablePrivileges{pgx.Identifier{schema, name}.Sanitize(), []string{"SELECT", "DELETE"}})
	}
	for _, t := range tables {
		var missing []string
		err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(p ORDER BY o), '{}')
			FROM unnest($2::text[]) WITH ORDINALITY AS u(p, o) WHERE NOT has_table_privilege($1, p)`, t.name, t.privs).Scan(&missing)
		if isCode(err, "42P01") || isCode(err, "3F000") {
			return &SetupError{Msg: fmt.Sprintf("table %s does not exist; run `outboxrelay migrate` or fix postgres.tables", t.name)}
		}
		if err != nil {
			return fmt.Errorf("check privileges on %s: %w", t.name, err)
		}
		if len(missing) > 0 {
			need(false, fmt.Sprintf("GRANT %s ON %s", strings.Join(missing, ", "), t.name))
		}
	}
	if p.DeadLetters {
		var seq *string
		var ok bool
		err := conn.QueryRow(ctx, `SELECT s, s IS NULL OR has_sequence_privilege(s, 'USAGE')
			FROM pg_get_serial_sequence('outboxrelay.dead_letters', 'id') s`).Scan(&seq, &ok)
		if err != nil {
			return fmt.Errorf("check privileges on the dead_letters sequence: %w", err)
		}
		if seq != nil {
			need(ok, "GRANT USAGE ON SEQUENCE "+*seq)
		}
	}
	if p.Heartbeat {
		// PUBLIC may execute it unless an administrator revoked that. The
		// signature differs between versions (PostgreSQL 17 added flush).
		var ok bool
		err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(has_function_privilege(p.oid, 'EXECUTE')), false)
			FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = 'pg_catalog' AND p.proname = 'pg_logical_emit_message'`).Scan(&ok)
		if err != nil {
			return fmt.Errorf("check the privilege to send heartbeats: %w", err)
		}
		if !ok {
			var sig string
			if err := conn.QueryRow(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
				WHERE p.proname = 'pg_logical_emit_message' AND p.proargtypes[2] = 'text'::regtype LIMIT 1`).Scan(&sig); err != nil {
				sig = "pg_logical_emit_message(boolean, text, text)"
			}
			need(false, "GRANT EXECUTE ON FUNCTION "+sig)
		}
	}
	if len(grants) == 0 {
		return nil
	}
	return &SetupError{Msg: fmt.Sprintf("role %s lacks privileges the relay needs; as the owner of the outboxrelay schema and the outbox tables, run: %s (see `outboxrelay migrate --print-role`)",
		role, strings.Join(grants, "; "))}
}

// displayIdent quotes an identifier for a hint only when SQL needs the quotes.
func displayIdent(s string) string {
	if identRE.MatchString(s) {
		return s
	}
	return pgx.Identifier{s}.Sanitize()
}

func privilegeHint(err error, need string) error {
	if isCode(err, "42501") {
		return &SetupError{Msg: fmt.Sprintf("%v; the relay's role needs %s (see `outboxrelay migrate --print-role`)", err, need)}
	}
	return err
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
