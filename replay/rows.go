// Package replay reads committed outbox rows back from their tables and
// publishes them again through a relay.Sink, with the envelope the relay
// builds from the WAL, so that consumers deduplicate them on message_id.
// verify, replay and recover are built on it.
//
// What the table cannot give back: the WAL positions of a row
// (source.lsn and source.commit_lsn are 0/0 in a replayed envelope) and,
// without track_commit_timestamp, its commit time (source.committed_at is
// then the row's creation time). Table-less messages
// (pg_logical_emit_message) are in no table and cannot be replayed.
package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/internal/rules"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Source describes the outbox tables and how the relay builds their
// messages.
type Source struct {
	// Tables are the outbox tables, schema.name.
	Tables  []string
	Columns relay.Columns
	// HeaderColumns and EnvelopeColumns are as in relay.Outbox: a row is
	// built with them as the relay builds it.
	HeaderColumns, EnvelopeColumns []string
	// Database, Format and CloudEventsSource are as in relay.Config.
	Database          string
	Format            relay.Format
	CloudEventsSource string
	// Rules are the routing rules (relay.Config.Rules): a row is built as
	// the relay routes it, and Scan reads every column of the table for
	// them.
	Rules rules.Config
}

// Filter selects rows. The time bounds apply to the creation time column
// (postgres.columns.created_at), the only time an outbox row holds.
type Filter struct {
	// Since is inclusive, Until exclusive; zero means unbounded.
	Since, Until time.Time
	// AggregateTypes and IDs, when set, keep only rows with one of them.
	AggregateTypes []string
	IDs            []string
	// Only, when set, is a temporary table of the session with a text
	// column id: only rows whose id is in it are selected (replay --missing).
	Only string
	// Except, when set, is a temporary table of the session with text
	// columns tbl (schema.name, as in Source.Tables) and id: rows listed in
	// it are not selected (those a first start leaves to the slot).
	Except string
	// DeadLettered, when set, is a slot: Scan hands the rows whose message
	// is pending in its dead letters, or parked behind one, to fn with
	// ErrDeadLettered.
	DeadLettered string
	// Newest, when positive, keeps only the newest so many rows of all
	// the tables, by creation time (postgres.columns.created_at) or, when
	// that is not mapped, by id; Scan still hands them in commit order.
	Newest int
}

// newestColumn is what Filter.Newest sorts rows by: the creation time
// column (postgres.columns.created_at) when it is mapped, else the id
// column, which increases for a bigserial or a UUIDv7 id.
func (s Source) newestColumn() string {
	if s.Columns.CreatedAt != "" {
		return pgx.Identifier{s.Columns.CreatedAt}.Sanitize()
	}
	return pgx.Identifier{s.Columns.ID}.Sanitize()
}

// ErrNoCreatedAt is returned for a time window on tables without a creation
// time column.
var ErrNoCreatedAt = errors.New("postgres.columns.created_at is empty, so outbox rows have no time to select a window by; map it to the table's creation time column, or select rows with --id")

// Querier is what reading rows needs: a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// where returns the WHERE clause of f for the source's columns and its
// arguments.
func (s Source) where(f Filter) (string, []any, error) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	c := s.Columns
	if !f.Since.IsZero() || !f.Until.IsZero() {
		if c.CreatedAt == "" {
			return "", nil, ErrNoCreatedAt
		}
		col := pgx.Identifier{c.CreatedAt}.Sanitize()
		if !f.Since.IsZero() {
			conds = append(conds, col+" >= "+arg(f.Since))
		}
		if !f.Until.IsZero() {
			conds = append(conds, col+" < "+arg(f.Until))
		}
	}
	if len(f.AggregateTypes) > 0 {
		conds = append(conds, pgx.Identifier{c.AggregateType}.Sanitize()+"::text = ANY("+arg(f.AggregateTypes)+"::text[])")
	}
	if len(f.IDs) > 0 {
		conds = append(conds, pgx.Identifier{c.ID}.Sanitize()+"::text = ANY("+arg(f.IDs)+"::text[])")
	}
	if f.Only != "" {
		conds = append(conds, pgx.Identifier{c.ID}.Sanitize()+"::text IN (SELECT id FROM pg_temp."+pgx.Identifier{f.Only}.Sanitize()+")")
	}
	if len(conds) == 0 {
		return "", nil, nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args, nil
}

// tableWhere returns where, the WHERE clause of f, with the condition f
// puts on the rows of table alone added (Filter.Except).
func (s Source) tableWhere(where string, f Filter, table string) (string, error) {
	if f.Except == "" {
		return where, nil
	}
	ident, err := tableIdent(table)
	if err != nil {
		return "", err
	}
	// NOT EXISTS, not NOT IN: an anti join stays a hash join past
	// work_mem, where NOT IN's hashed subplan would fall back to a scan
	// of the list per row.
	cond := "NOT EXISTS (SELECT FROM pg_temp." + pgx.Identifier{f.Except}.Sanitize() + " o_except WHERE o_except.tbl = " + literal(table) +
		" AND o_except.id = " + ident + "." + pgx.Identifier{s.Columns.ID}.Sanitize() + "::text)"
	if where == "" {
		return " WHERE " + cond, nil
	}
	return where + " AND " + cond, nil
}

// literal quotes s as an SQL string (with standard_conforming_strings,
// on by default since PostgreSQL 9.1).
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// orderKeys are the columns, computed per row, that put rows in commit
// order per aggregate; the query that selects them sorts by them in this
// order (see Scan). Neither creation time (the start of the inserting
// transaction), nor the transaction id alone, nor the position in the table
// is that order:
//   - transactions: by commit time when track_commit_timestamp is on (rows
//     committed before it was turned on have none and come first), else by
//     transaction id: the order in which the transactions made their first
//     change, which is their commit order when writes to one aggregate are
//     serialised by the lock that first change takes (SELECT ... FOR UPDATE
//     or UPDATE of the aggregate), the usual case. age() counts back from
//     the current transaction, so it survives wraparound;
//   - within a transaction: by command (cmin), the order its statements ran;
//   - within one statement (a multi-row INSERT): by message id when it is a
//     UUIDv7, which the outbox library generates in increasing order for a
//     batch, else by table position, which is the insert order unless
//     concurrent inserts or space freed by deletes placed a later row on an
//     earlier page.
//
// cmin is the command that inserted the row as long as nothing updated or
// deleted it; outbox rows are only inserted.
func (s Source) orderKeys(commitTimes bool) []string {
	ts, age := "NULL::timestamptz", "age(xmin)"
	if commitTimes {
		ts = "pg_xact_commit_timestamp(xmin)"
		// The same commit time for all of a transaction's rows, those of
		// its savepoints (other xids) too: only rows without one need the id.
		age = "CASE WHEN pg_xact_commit_timestamp(xmin) IS NULL THEN age(xmin) ELSE 0 END"
	}
	id := pgx.Identifier{s.Columns.ID}.Sanitize() + "::text"
	return []string{
		ts + " AS o_committed",
		age + " AS o_age",
		"cmin::text::bigint AS o_command",
		"CASE WHEN substr(" + id + ", 15, 1) = '7' AND length(" + id + ") = 36 THEN lower(" + id + `) END COLLATE "C" AS o_uuid7`,
		"ctid AS o_ctid",
	}
}

// orderBy sorts by the orderKeys.
const orderBy = " ORDER BY o_committed NULLS FIRST, o_age DESC, o_command, o_uuid7, o_ctid"

// Count returns the number of rows f selects.
func (s Source) Count(ctx context.Context, db Querier, f Filter) (int64, error) {
	where, args, err := s.where(f)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, t := range s.Tables {
		ident, err := tableIdent(t)
		if err != nil {
			return 0, err
		}
		tw, err := s.tableWhere(where, f, t)
		if err != nil {
			return 0, err
		}
		var n int64
		if err := db.QueryRow(ctx, "SELECT count(*) FROM "+ident+tw, args...).Scan(&n); err != nil {
			return 0, fmt.Errorf("count rows of %s: %w", t, err)
		}
		total += n
	}
	return total, nil
}

// IDQuery returns a query of the id (as text) and creation time of every
// row f selects, over all tables, for use as a subquery, and its arguments.
func (s Source) IDQuery(f Filter) (string, []any, error) {
	where, args, err := s.where(f)
	if err != nil {
		return "", nil, err
	}
	created := "NULL::timestamptz"
	if s.Columns.CreatedAt != "" {
		created = pgx.Identifier{s.Columns.CreatedAt}.Sanitize()
	}
	var parts []string
	for _, t := range s.Tables {
		ident, err := tableIdent(t)
		if err != nil {
			return "", nil, err
		}
		tw, err := s.tableWhere(where, f, t)
		if err != nil {
			return "", nil, err
		}
		parts = append(parts, fmt.Sprintf("SELECT %s::text AS id, %s AS created_at FROM %s%s",
			pgx.Identifier{s.Columns.ID}.Sanitize(), created, ident, tw))
	}
	if len(parts) == 0 {
		return "", nil, errors.New("no outbox tables configured")
	}
	return strings.Join(parts, " UNION ALL "), args, nil
}

// Routes calls fn once for each distinct (aggregate_type, event_type,
// table) of the rows f selects: what the sink's destination templates are
// rendered from.
func (s Source) Routes(ctx context.Context, db Querier, f Filter, fn func(m *relay.Message) error) error {
	where, args, err := s.where(f)
	if err != nil {
		return err
	}
	for _, t := range s.Tables {
		ident, err := tableIdent(t)
		if err != nil {
			return err
		}
		schema, name, _ := cdc.SplitTable(t)
		tw, err := s.tableWhere(where, f, t)
		if err != nil {
			return err
		}
		rows, err := db.Query(ctx, fmt.Sprintf("SELECT DISTINCT %s::text, %s::text FROM %s%s",
			pgx.Identifier{s.Columns.AggregateType}.Sanitize(), pgx.Identifier{s.Columns.EventType}.Sanitize(), ident, tw), args...)
		if err != nil {
			return fmt.Errorf("read destinations of %s: %w", t, err)
		}
		for rows.Next() {
			m := &relay.Message{Table: schema + "." + name}
			if err := rows.Scan(&m.AggregateType, &m.EventType); err != nil {
				rows.Close()
				return err
			}
			if err := fn(m); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read destinations of %s: %w", t, err)
		}
	}
	return nil
}

// ErrDeadLettered is the reason Scan gives for a row whose message is
// already pending in the slot's dead letters or parked behind one
// (Filter.DeadLettered): `outboxrelay dlq replay` publishes it.
var ErrDeadLettered = errors.New("already in outboxrelay.dead_letters or outboxrelay.parked; `outboxrelay dlq replay` publishes it")

// ErrFiltered is the reason Scan gives for a row the routing rules drop
// (relay.Message.Filtered): the relay never publishes it, nor may a replay.
var ErrFiltered = errors.New("dropped by the routing rules (unmatched: drop)")

// otherColumns adds to rel and cols the columns of table ident that rel
// does not have yet.
func (s Source) otherColumns(ctx context.Context, db Querier, ident string, rel *cdc.Relation, cols *[]string) error {
	rows, err := db.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, ident)
	if err != nil {
		return fmt.Errorf("read the columns: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the columns: %w", err)
	}
	for _, n := range names {
		if !slices.ContainsFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == n }) {
			*cols = append(*cols, pgx.Identifier{n}.Sanitize()+"::text")
			rel.Columns = append(rel.Columns, cdc.Column{Name: n})
		}
	}
	return nil
}

// Scan builds the message of every row f selects, over all tables in
// commit order per aggregate (see orderKeys), and calls fn with it and the
// reason it cannot be sent: an invalid row, which the relay would have
// dead-lettered, or ErrDeadLettered. Rows stream from the server: memory
// does not grow with their number. fn's error stops the scan.
func (s Source) Scan(ctx context.Context, db Querier, f Filter, fn func(m *relay.Message, invalid error) error) error {
	return s.scan(ctx, db, f, func(b *relay.Builder, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin, deadLettered bool) error {
		ms, invalid := b.Rows(ctx, rel, ins, tx)
		if len(ms) == 0 {
			return invalid
		}
		for _, m := range ms {
			why := invalid
			if deadLettered {
				why = ErrDeadLettered
			} else if m.Filtered != "" {
				why = ErrFiltered
			}
			if err := fn(m, why); err != nil {
				return err
			}
		}
		return nil
	})
}

// RuleRows reads the rows f selects as Scan does, and calls fn with what
// the routing rules see of each (relay.Builder.RuleRow), without running
// them, and the reason the relay dead-letters the row before any rule runs.
// A relation's own error (a mapped column the table lacks) stops the read.
func (s Source) RuleRows(ctx context.Context, db Querier, f Filter, fn func(row *rules.Row, invalid error) error) error {
	return s.scan(ctx, db, f, func(b *relay.Builder, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin, _ bool) error {
		row, invalid := b.RuleRow(ctx, rel, ins, tx)
		if row == nil {
			return invalid
		}
		return fn(row, invalid)
	})
}

// scan reads the rows f selects, over all tables in commit order per
// aggregate, and calls fn with each as the relay's Builder takes it.
func (s Source) scan(ctx context.Context, db Querier, f Filter, fn func(b *relay.Builder, rel *cdc.Relation, ins *cdc.Insert, tx cdc.Begin, deadLettered bool) error) error {
	if f.Newest < 0 {
		return fmt.Errorf("newest %d: want a positive number of rows", f.Newest)
	}
	where, args, err := s.where(f)
	if err != nil {
		return err
	}
	var commitTimes bool
	var setting string
	if err := db.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp')").Scan(&setting); err == nil {
		commitTimes = setting == "on"
	}
	deadLettered := "false"
	if f.DeadLettered != "" {
		args = append(args, f.DeadLettered)
		slot := "$" + strconv.Itoa(len(args))
		// A hashed subplan: the dead letters are read once, not per row.
		deadLettered = pgx.Identifier{s.Columns.ID}.Sanitize() + "::text IN (SELECT message_id FROM outboxrelay.dead_letters WHERE slot = " + slot +
			" AND replayed_at IS NULL UNION ALL SELECT message_id FROM outboxrelay.parked WHERE slot = " + slot + ")"
	}
	b := relay.NewBuilder(relay.Config{
		Database: s.Database, Tables: s.Tables, Outbox: relay.Outbox{Columns: s.Columns, HeaderColumns: s.HeaderColumns, EnvelopeColumns: s.EnvelopeColumns},
		Envelope: relay.Envelope{Format: s.Format, CloudEventsSource: s.CloudEventsSource}, Rules: s.Rules,
	}, relay.Options{})
	c := s.Columns
	var rels []*cdc.Relation
	var parts []string
	for relID, t := range s.Tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return err
		}
		ident := pgx.Identifier{schema, name}.Sanitize()
		rel := &cdc.Relation{ID: uint32(relID + 1), Namespace: schema, Name: name}
		cols := []string{"'" + strconv.Itoa(relID) + "'::text", "xmin::text", "(" + deadLettered + ")::text"}
		if commitTimes {
			cols = append(cols, "pg_xact_commit_timestamp(xmin)::text")
		} else {
			cols = append(cols, "NULL::text")
		}
		cols = append(cols, s.orderKeys(commitTimes)...)
		named := append([]string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Headers, c.Traceparent, c.SchemaVersion, c.CreatedAt, c.Key, c.Timestamp},
			append(slices.Clone(s.HeaderColumns), s.EnvelopeColumns...)...)
		for _, n := range named {
			if n == "" || slices.ContainsFunc(rel.Columns, func(col cdc.Column) bool { return col.Name == n }) {
				continue
			}
			cols = append(cols, pgx.Identifier{n}.Sanitize()+"::text")
			rel.Columns = append(rel.Columns, cdc.Column{Name: n})
		}
		if len(s.Rules.Routes) > 0 {
			// The rules may read any column (row["region"]).
			if err := s.otherColumns(ctx, db, ident, rel, &cols); err != nil {
				return fmt.Errorf("outbox table %s: %w", t, err)
			}
		}
		var payloadType uint32
		if err := db.QueryRow(ctx, `SELECT atttypid FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped`,
			ident, c.Payload).Scan(&payloadType); err != nil {
			return fmt.Errorf("outbox table %s: read the type of column %s: %w", t, c.Payload, err)
		}
		for i := range rel.Columns {
			if rel.Columns[i].Name == c.Payload {
				rel.Columns[i].TypeOID = payloadType
			}
		}
		if f.Newest > 0 {
			// Last, after the row's columns, which are read by position.
			cols = append(cols, s.newestColumn()+" AS o_newest")
		}
		rels = append(rels, rel)
		tw, err := s.tableWhere(where, f, t)
		if err != nil {
			return err
		}
		parts = append(parts, "SELECT "+strings.Join(cols, ", ")+" FROM "+ident+tw)
	}
	if len(parts) == 0 {
		return errors.New("no outbox tables configured")
	}
	// One query over all tables: an aggregate's rows may be in several.
	query := strings.Join(parts, " UNION ALL ") + orderBy
	if f.Newest > 0 {
		// The newest rows of all tables, by the newest key each part
		// ends with, then in commit order as every scan is.
		args = append(args, f.Newest)
		query = "SELECT * FROM (SELECT * FROM (" + strings.Join(parts, " UNION ALL ") + ") AS o_all ORDER BY o_newest DESC, o_ctid DESC LIMIT $" +
			strconv.Itoa(len(args)) + ") AS o_newest_rows" + orderBy
	}
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("read rows of %s: %w", strings.Join(s.Tables, ", "), err)
	}
	defer rows.Close()
	const first = 4 + 5 // table number, xmin, dead-lettered, commit time, the order keys
	createdAt := -1
	for i, n := range rels[0].Columns {
		if n.Name == c.CreatedAt {
			createdAt = i
		}
	}
	for rows.Next() {
		raw := rows.RawValues()
		relID, err := strconv.Atoi(string(raw[0]))
		if err != nil || relID < 0 || relID >= len(rels) {
			return fmt.Errorf("read rows: table number %q", raw[0])
		}
		rel := rels[relID]
		xid, _ := strconv.ParseUint(string(raw[1]), 10, 32)
		ins := &cdc.Insert{Relation: rel, Values: make([][]byte, len(rel.Columns))}
		for i := range rel.Columns {
			if v := raw[i+first]; v != nil {
				ins.Values[i] = append([]byte(nil), v...)
			}
		}
		tx := cdc.Begin{XID: uint32(xid)}
		if raw[3] != nil {
			tx.CommitTime, _ = envelope.ParseTimestamp(raw[3])
		} else if createdAt >= 0 && ins.Values[createdAt] != nil {
			tx.CommitTime, _ = envelope.ParseTimestamp(ins.Values[createdAt])
		}
		if err := fn(b, rel, ins, tx, string(raw[2]) == "true"); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read rows of %s: %w", strings.Join(s.Tables, ", "), err)
	}
	return nil
}

func tableIdent(t string) (string, error) {
	schema, name, err := cdc.SplitTable(t)
	if err != nil {
		return "", err
	}
	return pgx.Identifier{schema, name}.Sanitize(), nil
}
