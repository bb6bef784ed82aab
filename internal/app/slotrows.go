package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// slotRowsTable is the temporary table, in the session of a first start
// on an existing slot, of the outbox rows the slot holds
// (replay.Filter.Except): the first start leaves them to the stream.
const slotRowsTable = "outboxrelay_slot_rows"

// slotRowsBatch is how many rows the slot holds are written to
// slotRowsTable at a time: what the first start keeps of them in memory.
const slotRowsBatch = 10000

// createSlotRows makes slotRowsTable, empty, in conn's session. It is made
// before the read-only transaction of the first start, which cannot create
// a table but may write to a temporary one. drop removes it.
func createSlotRows(ctx context.Context, conn *pgx.Conn) (drop func(), err error) {
	ident := "pg_temp." + pgx.Identifier{slotRowsTable}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+ident+"; CREATE TEMPORARY TABLE "+pgx.Identifier{slotRowsTable}.Sanitize()+" (tbl text, id text)"); err != nil {
		return nil, fmt.Errorf("first start: create a temporary table for the rows the slot holds: %w", err)
	}
	return func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+ident) }, nil
}

// listSlotRows writes to slotRowsTable, in tx, the rows of tables that the
// existing slot will deliver, and returns their number. tx must not have
// read anything yet: its first statement takes the snapshot that the
// backfill reads in, and the slot is peeked (cdc.Peek, on a connection of
// db) up to the end of the WAL at that moment, so that every transaction
// visible in the snapshot that the slot also holds is listed. A transaction
// the slot holds is one that committed after its start, whenever it began:
// PostgreSQL creates a slot only once the transactions running meanwhile
// have ended, so none is held in part.
func (a *App) listSlotRows(ctx context.Context, tx pgx.Tx, db cdc.Querier, tables []string) (int64, error) {
	pg := a.cfg.Postgres
	var end string
	// A standby's snapshot sees what it has replayed.
	if err := tx.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END)::text`).Scan(&end); err != nil {
		return 0, fmt.Errorf("first start: read the end of the WAL: %w", err)
	}
	upto, err := pglogrepl.ParseLSN(end)
	if err != nil {
		return 0, fmt.Errorf("first start: parse the end of the WAL %q: %w", end, err)
	}
	if err := waitFlushed(ctx, db, upto); err != nil {
		return 0, err
	}
	names := make(map[string]string, len(tables))
	for _, t := range tables {
		schema, name, err := cdc.SplitTable(t)
		if err != nil {
			return 0, err
		}
		names[schema+"."+name] = t
	}
	idColumn := map[*cdc.Relation]int{}
	var held int64
	batch := make([][]any, 0, slotRowsBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{slotRowsTable}, []string{"tbl", "id"}, pgx.CopyFromRows(batch)); err != nil {
			return fmt.Errorf("first start: list the rows the slot holds: %w", err)
		}
		batch = batch[:0]
		return nil
	}
	err = cdc.Peek(ctx, db, pg.Slot, pg.Publication, upto, func(ins *cdc.Insert) error {
		t, ok := names[ins.Relation.QualifiedName()]
		if !ok {
			return nil
		}
		col, ok := idColumn[ins.Relation]
		if !ok {
			col = columnIndex(ins.Relation, pg.Columns.ID)
			idColumn[ins.Relation] = col
		}
		if col < 0 || ins.Values[col] == nil {
			// The stream dead-letters such a row; no table row has this id.
			return nil
		}
		held++
		batch = append(batch, []any{t, string(ins.Values[col])})
		if len(batch) == slotRowsBatch {
			return flush()
		}
		return nil
	})
	if errors.Is(err, cdc.ErrSlotActive) {
		return 0, fmt.Errorf("first start: %w; stop the process that reads replication slot %s, then start the relay again", err, pg.Slot)
	}
	if err != nil {
		return 0, fmt.Errorf("first start: read what replication slot %s holds: %w", pg.Slot, err)
	}
	if err := flush(); err != nil {
		return 0, err
	}
	// The backfill's anti join needs the row count to choose a hash join.
	if _, err := tx.Exec(ctx, "ANALYZE pg_temp."+pgx.Identifier{slotRowsTable}.Sanitize()); err != nil {
		return 0, fmt.Errorf("first start: analyze the rows the slot holds: %w", err)
	}
	return held, nil
}

// waitFlushed waits until PostgreSQL has flushed the WAL up to lsn: the
// slot is decoded only that far, and a transaction committed with
// synchronous_commit off is visible before it is flushed.
func waitFlushed(ctx context.Context, db cdc.Querier, lsn cdc.LSN) error {
	for {
		var flushed bool
		if err := db.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END >= $1::pg_lsn`,
			lsn.String()).Scan(&flushed); err != nil {
			return fmt.Errorf("first start: read the flushed WAL position: %w", err)
		}
		if flushed {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// columnIndex returns the position of the column name in rel, or -1.
func columnIndex(rel *cdc.Relation, name string) int {
	for i, c := range rel.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}
