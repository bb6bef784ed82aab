package store

import (
	"context"
	"fmt"

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
