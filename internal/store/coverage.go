package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/cdc"
)

// RegisterCoverage registers table (schema.name) of publication pub with
// the coverage event trigger, in outboxrelay.coverage, unless it is
// registered already. migrate registers its tables; looking first
// (outboxrelay.coverage is readable by PUBLIC) spares a relay role without
// the INSERT privilege an error.
func RegisterCoverage(ctx context.Context, db DB, pub, table string) error {
	schema, name, err := cdc.SplitTable(table)
	if err != nil {
		return err
	}
	var registered bool
	err = db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM outboxrelay.coverage WHERE publication = $1 AND schema_name = $2 AND table_name = $3)`,
		pub, schema, name).Scan(&registered)
	if err == nil && !registered {
		_, err = db.Exec(ctx, `INSERT INTO outboxrelay.coverage (publication, schema_name, table_name) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, pub, schema, name)
	}
	if err != nil {
		return fmt.Errorf("register %s with the coverage trigger: %w", table, err)
	}
	return nil
}

// DropPublication undoes what a failed first start did for publication pub,
// which it created: it drops the publication, with the coverage trigger's
// rows for it, and forgets that slot was to be consumed through it, so that
// the database is as the start found it. It keeps them all, and reports
// false, when slot exists or another slot's relay has recorded pub: a
// relay that started meanwhile streams through it. One transaction.
func DropPublication(ctx context.Context, db TxDB, pub, slot string) (dropped bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) // after Commit this is a no-op
	var inUse, guarded bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $2)
			OR EXISTS (SELECT FROM outboxrelay.checkpoint WHERE publication = $1 AND slot <> $2),
			EXISTS (SELECT FROM outboxrelay.coverage WHERE publication = $1)`, pub, slot).Scan(&inUse, &guarded)
	if err != nil || inUse {
		return false, err
	}
	// The trigger refuses to drop a publication that has rows: they go
	// first. Only when there are any: DELETE needs the privilege even for
	// no row, and the relay's role may lack it.
	if guarded {
		if _, err := tx.Exec(ctx, "DELETE FROM outboxrelay.coverage WHERE publication = $1", pub); err != nil {
			return false, fmt.Errorf("delete the coverage rows of publication %s: %w", pub, err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE outboxrelay.checkpoint SET publication = NULL, tables = NULL, relations = NULL
		WHERE slot = $1 AND publication = $2 AND confirmed_lsn IS NULL`, slot, pub); err != nil {
		return false, fmt.Errorf("forget how slot %s was to be consumed: %w", slot, err)
	}
	if _, err := tx.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize()); err != nil {
		return false, fmt.Errorf("drop publication %s: %w", pub, err)
	}
	return true, tx.Commit(ctx)
}
