package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Setup is [Prepare] followed by [EnsureSlot]: it checks that PostgreSQL
// can feed the relay and creates what is missing, the publication and the
// logical replication slot. It is idempotent and safe to run from several
// relays at once.
func Setup(ctx context.Context, conn *pgx.Conn, rec Record, cfg Config, requiredColumns []string) error {
	if _, err := Prepare(ctx, conn, rec, cfg, requiredColumns); err != nil {
		return err
	}
	_, err := EnsureSlot(ctx, conn, cfg.Slot, "postgres.slot", cfg.FailoverSlot)
	return err
}

// Prepare checks that PostgreSQL can feed the relay (wal_level, version,
// the REPLICATION attribute, the outbox tables and their columns, the
// outboxrelay schema, how the slot was consumed before) and creates or
// repairs the publication (inserts only, limited to the outbox tables). It
// creates no replication slot: a slot nobody reads keeps WAL until the disk
// fills, so the relay creates it with [EnsureSlot] only once everything else
// it needs has been checked. Problems an operator must fix come back as
// *SetupError with one sentence naming the fix. rec is the relay's record of
// cfg.Slot, read for how the slot was consumed and how far it was confirmed.
//
// It creates no publication for a slot that already exists (see
// [LatePublication]). createdPublication reports whether it created the
// publication, even when it then fails: a start that fails later drops it
// again (internal/store's DropPublication).
func Prepare(ctx context.Context, conn *pgx.Conn, rec Record, cfg Config, requiredColumns []string) (createdPublication bool, err error) {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return false, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return false, &SetupError{Msg: fmt.Sprintf("wal_level is %s; set wal_level=logical and restart PostgreSQL", walLevel)}
	}
	version, err := ServerVersion(ctx, conn)
	if err != nil {
		return false, err
	}
	if version < 140000 {
		return false, &SetupError{Msg: fmt.Sprintf("PostgreSQL %s is too old; outboxrelay needs PostgreSQL 14 or later", conn.PgConn().ParameterStatus("server_version"))}
	}

	var role string
	var canReplicate bool
	if err := conn.QueryRow(ctx, `SELECT rolname, rolreplication OR rolsuper OR EXISTS (
			SELECT 1 FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'member'))
		FROM pg_roles WHERE rolname = current_user`).Scan(&role, &canReplicate); err != nil {
		return false, fmt.Errorf("read role attributes: %w", err)
	}
	if !canReplicate {
		return false, &SetupError{Msg: fmt.Sprintf("role %s lacks the REPLICATION privilege; run: ALTER ROLE %s REPLICATION", role, displayIdent(role))}
	}

	for _, t := range cfg.Tables {
		schema, name, err := SplitTable(t)
		if err != nil {
			return false, &SetupError{Msg: err.Error()}
		}
		var cols []string
		err = conn.QueryRow(ctx, `
			SELECT coalesce(array_agg(a.attname::text), '{}')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
			WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
			GROUP BY c.oid`, schema, name).Scan(&cols)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, &SetupError{Msg: fmt.Sprintf("outbox table %s.%s does not exist; run `outboxrelay migrate` or fix postgres.tables", schema, name)}
		}
		if err != nil {
			return false, fmt.Errorf("inspect table %s.%s: %w", schema, name, err)
		}
		for _, want := range requiredColumns {
			if !contains(cols, want) {
				return false, &SetupError{Msg: fmt.Sprintf("outbox table %s.%s has no column %q; add it or map it in postgres.columns", schema, name, want)}
			}
		}
	}

	if err := rec.Ready(ctx); err != nil {
		return false, err
	}
	was, ok, err := rec.Consumer(ctx)
	if err != nil {
		return false, err
	}
	if _, err := CheckSlot(ctx, conn, cfg.Slot, "postgres.slot", cfg.FailoverSlot); err != nil {
		return false, err
	}
	var consumed string
	var recorded []string
	if ok {
		consumed = was.Publication
		// Before anything changes: a relay with another configuration (a
		// standby, say) must not take the slot over.
		state, err := ReadCoverage(ctx, conn, cfg.Publication, qualify(cfg.Tables))
		if err != nil {
			return false, err
		}
		cur := Consumer{Publication: cfg.Publication, Tables: qualify(cfg.Tables), Relations: state.Tables}
		if err := CompareConsumer(cfg.Slot, was, cur); err != nil {
			if !cfg.AcceptConfigChange {
				return false, err
			}
			cfg.logger().Warn("taking the slot over with a new configuration (--accept-config-change)", zap.String("was", err.Error()))
		} else if was.Publication == cfg.Publication {
			recorded = was.Tables
		}
	}
	late, err := FindLatePublication(ctx, conn, cfg.Slot, cfg.Publication, qualify(cfg.Tables), consumed)
	if err != nil {
		return false, err
	}
	if late != nil {
		return false, late.Err(ModeRun, "postgres.publication")
	}
	changed, created, err := EnsurePublication(ctx, conn, cfg.Publication, qualify(cfg.Tables), recorded, qualify(cfg.IgnoreTables), ModeRun)
	if err != nil {
		return created, err
	}
	for _, c := range changed {
		cfg.logger().Warn(c)
	}
	return created, refuseMissingSlot(ctx, conn, rec, cfg.Slot)
}

// refuseMissingSlot fails when the slot does not exist although the relay
// has confirmed positions of it here (MissingSlot decides).
func refuseMissingSlot(ctx context.Context, conn *pgx.Conn, rec Record, slot string) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists); err != nil {
		return fmt.Errorf("look for slot %s: %w", slot, err)
	}
	if exists {
		return nil
	}
	confirmed, ok, err := rec.Confirmed(ctx)
	if err != nil {
		return err
	}
	return MissingSlot(slot, confirmed, ok, ReadTimeline(ctx, conn))
}

// ReadTimeline returns the server's current timeline, or 0 when it cannot
// be read (on a standby, pg_walfile_name fails). The WAL file name begins
// with the timeline, in hex.
func ReadTimeline(ctx context.Context, q CatalogReader) int64 {
	var timeline int64
	if err := q.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`).Scan(&timeline); err != nil {
		return 0
	}
	return timeline
}

// MissingSlot is what the relay decides at start about a slot that does not
// exist: nil, it creates the slot, when it has confirmed no position of it
// here (recorded is false); otherwise the *SetupError it refuses to start
// with, since a fresh slot would start at the server's current position,
// skipping every row committed since the last confirmation. The slot was
// dropped, or the server was promoted and the slot did not follow
// (PostgreSQL 14-16, or a slot created without failover): timeline (0 when
// unknown) says which is likely, as a server that was never promoted or
// restored is still on timeline 1. `status` reports the same.
func MissingSlot(slot string, confirmed LSN, recorded bool, timeline int64) error {
	if !recorded {
		return nil
	}
	const fix = "run `outboxrelay recover --config FILE` to create the slot and republish them from the outbox table"
	switch {
	case timeline == 1:
		return &SetupError{Msg: fmt.Sprintf(
			"replication slot %s does not exist on this server, but the relay confirmed it up to %s here: it was dropped (pg_drop_replication_slot, a tool that removes slots, or a pg_upgrade before PostgreSQL 17, which leaves slots behind), and rows committed since then may never have been relayed; "+fix,
			slot, confirmed)}
	case timeline > 1:
		return &SetupError{Msg: fmt.Sprintf(
			"replication slot %s does not exist on this server, but the relay confirmed it up to %s here: the server is on timeline %d, so it was promoted from a standby or restored from a backup, and if that happened since, the slot did not follow (PostgreSQL 14-16, or a slot without postgres.failover_slot); otherwise it was dropped; either way rows committed since then may never have been relayed; "+fix,
			slot, confirmed, timeline)}
	default:
		return &SetupError{Msg: fmt.Sprintf(
			"replication slot %s does not exist on this server, but the relay confirmed it up to %s here: it was dropped, or after a failover the slot did not follow (PostgreSQL 14-16, or a slot without postgres.failover_slot), and rows committed since then may never have been relayed; "+fix,
			slot, confirmed)}
	}
}

// LostSlot is the *SetupError the relay refuses to start with, and `status`
// reports, for a slot whose WAL PostgreSQL removed.
func LostSlot(slot string) error {
	return &SetupError{Msg: fmt.Sprintf("replication slot %s has wal_status=lost: PostgreSQL removed WAL it still needed (max_slot_wal_keep_size); run `outboxrelay recover --config FILE` to re-create it and republish what was missed from the outbox table", slot)}
}

// Mode says who prepares the publication: migrate repairs what it finds,
// the relay refuses what may already have lost inserts.
type Mode int

// The modes of EnsurePublication.
const (
	ModeRun Mode = iota
	ModeMigrate
)

// EnsurePublication creates the publication for tables (inserts only,
// publish_via_partition_root) or checks and repairs an existing one: it
// must contain the tables, publish inserts and publish partitions under
// their root. A repair that would change what the publication sends for
// other tables is refused. In ModeRun, a state in which inserts may already
// have been lost is refused with the fix (migrate) instead of being repaired
// quietly: a table that slot consumers (recorded) relayed before and that
// left the publication, a publication without inserts, a partitioned table
// published without its root. ignored tables may be in the publication. It
// returns what it changed, one line each, and whether it created the
// publication (not when another relay created it meanwhile). The caller
// checks first that no slot is older than the publication (see
// [FindLatePublication]).
func EnsurePublication(ctx context.Context, conn *pgx.Conn, pub string, tables, recorded, ignored []string, mode Mode) (changed []string, created bool, err error) {
	ident := pgx.Identifier{pub}.Sanitize()
	var idents []string
	for _, t := range tables {
		schema, name, err := SplitTable(t)
		if err != nil {
			return nil, false, &SetupError{Msg: err.Error()}
		}
		idents = append(idents, pgx.Identifier{schema, name}.Sanitize())
	}
	s, err := ReadCoverage(ctx, conn, pub, tables)
	if err != nil {
		return nil, false, err
	}
	for _, t := range tables {
		if u := s.Unlogged[t]; len(u) > 0 {
			return nil, false, &SetupError{Msg: fmt.Sprintf("%s; run ALTER TABLE %s SET LOGGED, then republish the rows inserted into it from the outbox table",
				unlogged(t, u[0]), sanitizeTable(u[0]))}
		}
		if f := s.Foreign[t]; len(f) > 0 {
			return nil, false, &SetupError{Msg: fmt.Sprintf("%s; run ALTER TABLE %s DETACH PARTITION %s, then republish the rows inserted into it from the outbox table",
				foreign(t, f[0]), sanitizeTable(t), sanitizeTable(f[0]))}
		}
	}
	if !s.Exists {
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
			ident, strings.Join(idents, ", ")))
		if isCode(err, "42710") { // duplicate_object: another relay won the race
			return nil, false, nil
		}
		if err != nil {
			return nil, false, privilegeHint(fmt.Errorf("create publication %s: %w", pub, err), "CREATE on the database, and ownership of the outbox tables")
		}
		return []string{"created publication " + pub}, true, nil
	}
	var others []string
	for _, t := range s.Others {
		if !slices.Contains(ignored, t) {
			others = append(others, t)
		}
	}
	if len(others) > 0 {
		// Not refused here: a table swap leaves the old table in the
		// publication, and nothing is inserted into it. An insert into it
		// stops the relay (Guard.Resolve), before it is confirmed.
		changed = append(changed, fmt.Sprintf("publication %s also publishes %s, which is not in postgres.tables: an insert into it stops the relay; add it to postgres.tables or postgres.ignore_tables, or remove it from the publication",
			pub, strings.Join(others, ", ")))
	}
	if !s.Insert || !s.ViaRoot {
		if s.AllTables || len(s.Others) > 0 {
			what := "tables " + strings.Join(s.Others, ", ")
			if s.AllTables {
				what = "all tables"
			}
			return nil, false, &SetupError{Msg: fmt.Sprintf("publication %s lacks publish = insert or publish_via_partition_root, and it also publishes %s: changing its options would change what it sends for them; give the relay a publication of its own (postgres.publication) or remove those tables from %s", pub, what, pub)}
		}
		if mode == ModeRun && !s.Insert {
			return nil, false, &SetupError{Msg: fmt.Sprintf("publication %s does not publish inserts, so inserts into %s are not relayed; run `outboxrelay migrate` to repair it, then republish the rows inserted while it did not from the outbox table", pub, strings.Join(tables, ", "))}
		}
		if mode == ModeRun && len(s.Partitioned) > 0 {
			return nil, false, &SetupError{Msg: fmt.Sprintf("publication %s lacks publish_via_partition_root, so inserts into partitioned %s come under partition names; run `outboxrelay migrate` to repair it, then republish the rows inserted meanwhile from the outbox table", pub, strings.Join(s.Partitioned, ", "))}
		}
		var actions []string
		err := conn.QueryRow(ctx, `SELECT array_remove(ARRAY['insert',
				CASE WHEN pubupdate THEN 'update' END, CASE WHEN pubdelete THEN 'delete' END, CASE WHEN pubtruncate THEN 'truncate' END], NULL)
			FROM pg_publication WHERE pubname = $1`, pub).Scan(&actions)
		if err != nil {
			return nil, false, fmt.Errorf("read publication %s: %w", pub, err)
		}
		_, err = conn.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s SET (publish = '%s', publish_via_partition_root = true)", ident, strings.Join(actions, ", ")))
		if err != nil {
			return nil, false, privilegeHint(fmt.Errorf("repair publication %s: %w", pub, err), "ownership of the publication")
		}
		if !s.Insert {
			changed = append(changed, fmt.Sprintf("publication %s did not publish inserts: set publish = '%s'; inserts committed before this were not relayed and must be republished from the outbox table", pub, strings.Join(actions, ", ")))
		} else {
			changed = append(changed, fmt.Sprintf("publication %s: set publish_via_partition_root = true", pub))
		}
	}
	for i, t := range tables {
		filter := s.Filtered[t]
		if filter == "" {
			continue
		}
		if mode == ModeRun {
			return nil, false, &SetupError{Msg: fmt.Sprintf("outbox table %s is in publication %s with a %s, so the rows or columns it leaves out are not relayed; run `outboxrelay migrate` to publish it whole, republish the rows it left out from the outbox table, then start the relay with --accept-config-change",
				t, pub, filter)}
		}
		if err := republishWhole(ctx, conn, ident, idents[i]); err != nil {
			return nil, false, privilegeHint(fmt.Errorf("publish %s whole in publication %s: %w", t, pub, err), "ownership of the publication and of the table")
		}
		changed = append(changed, fmt.Sprintf("publication %s had %s with a %s: re-added it whole; rows it left out before this were not relayed and must be republished from the outbox table", pub, t, filter))
	}
	for i, t := range tables {
		if s.Tables[t].OID == 0 || s.Published[t] {
			continue
		}
		if mode == ModeRun && slices.Contains(recorded, t) {
			return nil, false, &SetupError{Msg: fmt.Sprintf("outbox table %s is no longer in publication %s, though the relay consumed it through it: inserts since it left were not relayed; add it back (`outboxrelay migrate` or ALTER PUBLICATION %s ADD TABLE %s), republish the rows inserted meanwhile from the outbox table, then start the relay with --accept-config-change",
				t, pub, ident, idents[i])}
		}
		if s.AllTables {
			continue
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", ident, idents[i]))
		if err != nil && !isCode(err, "42710") {
			return nil, false, privilegeHint(fmt.Errorf("add %s to publication %s: %w", t, pub, err), "ownership of the publication and of the table")
		}
		changed = append(changed, fmt.Sprintf("added %s to publication %s", t, pub))
	}
	return changed, false, nil
}

// republishWhole replaces table's membership in publication pub (both
// sanitized) by one without a row filter or column list, in one
// transaction: pgoutput sees either membership, never a gap between them.
func republishWhole(ctx context.Context, conn *pgx.Conn, pub, table string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // after Commit this is a no-op
	if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s", pub, table)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, table)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// FailoverVersion is the first PostgreSQL version (server_version_num)
// whose logical slots can follow a failover to a physical standby.
const FailoverVersion = 170000

// EnsureSlot creates the logical replication slot (pgoutput) if it is missing
// and checks an existing one (see [CheckSlot]); created reports whether this
// call created it. From its creation on, every committed outbox row is kept
// for the relay, even before the relay first runs. setting names where the
// slot's name came from (postgres.slot, --slot), for the hints in errors.
// With failover, the slot is created as a failover slot, which PostgreSQL 17
// and later synchronize to standbys that set sync_replication_slots; on
// older versions, or when an existing slot was created without failover, it
// fails with a *SetupError naming the fix.
func EnsureSlot(ctx context.Context, conn *pgx.Conn, slot, setting string, failover bool) (created bool, err error) {
	exists, err := CheckSlot(ctx, conn, slot, setting, failover)
	if err != nil || exists {
		return false, err
	}
	create := "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
	if failover {
		create = "SELECT pg_create_logical_replication_slot($1, 'pgoutput', failover => true)"
	}
	_, err = conn.Exec(ctx, create, slot)
	if isCode(err, "42710") { // another relay won the race: check what it made
		_, err = CheckSlot(ctx, conn, slot, setting, failover)
		return false, err
	}
	if err != nil {
		return false, privilegeHint(fmt.Errorf("create replication slot %s: %w", slot, err), "the REPLICATION attribute")
	}
	return true, nil
}

// CheckSlot reports whether the replication slot exists and, when it does,
// that the relay can stream from it: plugin pgoutput, this database, WAL
// not lost, a failover slot when failover is asked for. It changes nothing.
func CheckSlot(ctx context.Context, conn *pgx.Conn, slot, setting string, failover bool) (exists bool, err error) {
	version, err := ServerVersion(ctx, conn)
	if err != nil {
		return false, err
	}
	if failover && version < FailoverVersion {
		return false, &SetupError{Msg: fmt.Sprintf("postgres.failover_slot needs PostgreSQL 17 or later, and this server is PostgreSQL %s; upgrade, or set postgres.failover_slot: false (the slot will then not follow a failover; see docs/operations.md, PostgreSQL failover)",
			conn.PgConn().ParameterStatus("server_version"))}
	}
	var plugin, walStatus string
	var database *string
	var isFailover bool
	q := "SELECT coalesce(plugin, ''), coalesce(wal_status, ''), database, false FROM pg_replication_slots WHERE slot_name = $1"
	if version >= FailoverVersion {
		q = "SELECT coalesce(plugin, ''), coalesce(wal_status, ''), database, failover FROM pg_replication_slots WHERE slot_name = $1"
	}
	err = conn.QueryRow(ctx, q, slot).Scan(&plugin, &walStatus, &database, &isFailover)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	if failover && !isFailover {
		return true, &SetupError{Msg: fmt.Sprintf("replication slot %s was created without failover; enable it on a replication connection: psql \"dbname=DB replication=database\" -c 'ALTER_REPLICATION_SLOT %s (FAILOVER true)', or set postgres.failover_slot: false", slot, slot)}
	}
	if plugin != "pgoutput" {
		return true, &SetupError{Msg: fmt.Sprintf("replication slot %s uses plugin %q; drop it or choose another %s (outboxrelay needs pgoutput)", slot, plugin, setting)}
	}
	var current string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&current); err != nil {
		return true, fmt.Errorf("read current database: %w", err)
	}
	if database == nil || *database != current {
		return true, &SetupError{Msg: fmt.Sprintf("replication slot %s belongs to another database; choose another %s", slot, setting)}
	}
	if walStatus == "lost" {
		return true, LostSlot(slot)
	}
	return true, nil
}

// ServerVersion returns the server's server_version_num (170002 for 17.2).
// Servers before 18 do not report it at connection time, so it is asked.
func ServerVersion(ctx context.Context, conn *pgx.Conn) (int, error) {
	if v, err := strconv.Atoi(conn.PgConn().ParameterStatus("server_version_num")); err == nil {
		return v, nil
	}
	var s string
	if err := conn.QueryRow(ctx, "SHOW server_version_num").Scan(&s); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("server_version_num %q: %w", s, err)
	}
	return v, nil
}

// Privileges names the optional parts of the relay that write to
// PostgreSQL, so that CheckPrivileges asks only for what will be used.
type Privileges struct {
	// DeadLetters: the relay inserts into outboxrelay.dead_letters.
	DeadLetters bool
	// Parking: the relay parks aggregates behind dead letters (locks heads
	// in outboxrelay.dead_letters, inserts into outboxrelay.parked).
	Parking bool
	// Heartbeat: the relay calls pg_logical_emit_message.
	Heartbeat bool
	// Spill: the relay stores the messages of a sink that is behind in
	// outboxrelay.spilled (several sinks, relay.behind: spill).
	Spill bool
	// Retention lists the outbox tables (schema.name) the relay deletes
	// old rows from.
	Retention []string
}

// missingTable is the error for a table CheckPrivileges did not find: one
// of the relay's own is missing from a schema an older migrate made.
func missingTable(name string) string {
	switch {
	case name == "outboxrelay.spilled":
		return "table outboxrelay.spilled does not exist: schema outboxrelay is from an older version; run `outboxrelay migrate` to update it, or set relay.behind: hold"
	case strings.HasPrefix(name, "outboxrelay."):
		return fmt.Sprintf("table %s does not exist: schema outboxrelay is from an older version; run `outboxrelay migrate` to update it", name)
	}
	return fmt.Sprintf("table %s does not exist; run `outboxrelay migrate` or fix postgres.tables", name)
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
	if p.Spill {
		tables = append(tables, tablePrivileges{"outboxrelay.spilled", []string{"SELECT", "INSERT", "DELETE"}})
	}
	if p.Parking {
		tables = append(tables, tablePrivileges{"outboxrelay.dead_letters", []string{"SELECT", "UPDATE"}},
			tablePrivileges{"outboxrelay.parked", []string{"INSERT"}})
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
			return &SetupError{Msg: missingTable(t.name)}
		}
		if err != nil {
			return fmt.Errorf("check privileges on %s: %w", t.name, err)
		}
		if len(missing) > 0 {
			need(false, fmt.Sprintf("GRANT %s ON %s", strings.Join(missing, ", "), t.name))
		}
	}
	var sequences []string
	if p.DeadLetters {
		sequences = append(sequences, "outboxrelay.dead_letters")
	}
	if p.Parking {
		sequences = append(sequences, "outboxrelay.parked")
	}
	if p.Spill {
		sequences = append(sequences, "outboxrelay.spilled")
	}
	for _, table := range sequences {
		var seq *string
		var ok bool
		err := conn.QueryRow(ctx, `SELECT s, s IS NULL OR has_sequence_privilege(s, 'USAGE')
			FROM pg_get_serial_sequence($1, 'id') s`, table).Scan(&seq, &ok)
		if err != nil {
			return fmt.Errorf("check privileges on the %s sequence: %w", table, err)
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

// qualify writes each table as schema.name.
func qualify(tables []string) []string {
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		if schema, name, err := SplitTable(t); err == nil {
			out = append(out, schema+"."+name)
		}
	}
	return out
}
