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
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
)

// Source describes the outbox tables and how the relay builds their
// messages.
type Source struct {
	// Tables are the outbox tables, schema.name.
	Tables  []string
	Columns relay.Columns
	// Database, Format and CloudEventsSource are as in relay.Config.
	Database          string
	Format            relay.Format
	CloudEventsSource string
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

// order is the order rows are read in: creation time (the start of the
// inserting transaction), then position in the table, which is the insert
// order within a transaction unless rows were placed into space freed by
// deletes. Within one aggregate whose writes are serialized (the usual
// case: one aggregate is changed by one transaction at a time) it is the
// commit order.
func (s Source) order() string {
	if s.Columns.CreatedAt == "" {
		return " ORDER BY ctid"
	}
	return " ORDER BY " + pgx.Identifier{s.Columns.CreatedAt}.Sanitize() + ", ctid"
}

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
		var n int64
		if err := db.QueryRow(ctx, "SELECT count(*) FROM "+ident+where, args...).Scan(&n); err != nil {
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
		parts = append(parts, fmt.Sprintf("SELECT %s::text AS id, %s AS created_at FROM %s%s",
			pgx.Identifier{s.Columns.ID}.Sanitize(), created, ident, where))
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
		rows, err := db.Query(ctx, fmt.Sprintf("SELECT DISTINCT %s::text, %s::text FROM %s%s",
			pgx.Identifier{s.Columns.AggregateType}.Sanitize(), pgx.Identifier{s.Columns.EventType}.Sanitize(), ident, where), args...)
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

// Scan builds the message of every row f selects, table by table in
// creation order, and calls fn with it and the reason it cannot be sent
// (an invalid row, which the relay would have dead-lettered). Rows stream
// from the server: memory does not grow with their number. fn's error
// stops the scan.
func (s Source) Scan(ctx context.Context, db Querier, f Filter, fn func(m *relay.Message, invalid error) error) error {
	where, args, err := s.where(f)
	if err != nil {
		return err
	}
	var commitTimes bool
	var setting string
	if err := db.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp')").Scan(&setting); err == nil {
		commitTimes = setting == "on"
	}
	b := relay.NewBuilder(relay.Config{
		Database: s.Database, Tables: s.Tables, Columns: s.Columns,
		Format: s.Format, CloudEventsSource: s.CloudEventsSource,
	})
	c := s.Columns
	for relID, t := range s.Tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return err
		}
		ident := pgx.Identifier{schema, name}.Sanitize()
		rel := &cdc.Relation{ID: uint32(relID + 1), Namespace: schema, Name: name}
		cols := []string{"xmin::text"}
		if commitTimes {
			cols = append(cols, "pg_xact_commit_timestamp(xmin)::text")
		} else {
			cols = append(cols, "NULL::text")
		}
		for _, n := range []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Headers, c.Traceparent, c.SchemaVersion, c.CreatedAt} {
			if n == "" {
				continue
			}
			cols = append(cols, pgx.Identifier{n}.Sanitize()+"::text")
			rel.Columns = append(rel.Columns, cdc.Column{Name: n})
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
		rows, err := db.Query(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+ident+where+s.order(), args...)
		if err != nil {
			return fmt.Errorf("read rows of %s: %w", t, err)
		}
		createdAt := -1
		for i, col := range rel.Columns {
			if col.Name == c.CreatedAt {
				createdAt = i
			}
		}
		for rows.Next() {
			raw := rows.RawValues()
			xid, _ := strconv.ParseUint(string(raw[0]), 10, 32)
			ins := &cdc.Insert{Relation: rel, Values: make([][]byte, len(rel.Columns))}
			for i := range rel.Columns {
				if v := raw[i+2]; v != nil {
					ins.Values[i] = append([]byte(nil), v...)
				}
			}
			tx := cdc.Begin{XID: uint32(xid)}
			if raw[1] != nil {
				tx.CommitTime, _ = envelope.ParseTimestamp(raw[1])
			} else if createdAt >= 0 && ins.Values[createdAt] != nil {
				tx.CommitTime, _ = envelope.ParseTimestamp(ins.Values[createdAt])
			}
			m, invalid := b.Row(ctx, rel, ins, tx)
			if m == nil {
				rows.Close()
				return invalid
			}
			if err := fn(m, invalid); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read rows of %s: %w", t, err)
		}
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
