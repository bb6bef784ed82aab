package integration

import (
	"slices"
	"testing"
)

// TestMigrateUpgradesStatusView: a database whose view is from an older
// version (version 2 had no lag_seconds) gets the new view from migrate, and a
// second migrate leaves it alone.
func TestMigrateUpgradesStatusView(t *testing.T) {
	e := newEnv(t)
	// What version 2 left: the same columns but lag_seconds, under its comment.
	e.exec(`DROP VIEW outboxrelay.status`)
	e.exec(`CREATE VIEW outboxrelay.status AS SELECT slot, true AS exists, last_lsn AS last_published_lsn FROM outboxrelay.checkpoint`)
	e.exec(`COMMENT ON VIEW outboxrelay.status IS 'outboxrelay status, version 2'`)
	for range 2 {
		if out, code := e.cli("migrate", "--database-url", e.dbURL); code != 0 {
			t.Fatalf("migrate exited %d: %s", code, out)
		}
		rows, err := e.db.Query(t.Context(), "SELECT * FROM outboxrelay.status")
		if err != nil {
			t.Fatal(err)
		}
		var cols []string
		for _, f := range rows.FieldDescriptions() {
			cols = append(cols, f.Name)
		}
		rows.Close()
		if i := slices.Index(cols, "lag_seconds"); i < 0 || cols[i-1] != "lag_bytes" {
			t.Fatalf("view columns after migrate: %v, want lag_seconds after lag_bytes", cols)
		}
		if i := slices.Index(cols, "republished_total"); i < 0 || cols[i-1] != "published_total" {
			t.Fatalf("view columns after migrate: %v, want republished_total after published_total", cols)
		}
		var comment string
		if err := e.db.QueryRow(t.Context(), `SELECT obj_description('outboxrelay.status'::regclass, 'pg_class')`).Scan(&comment); err != nil || comment != "outboxrelay status, version 4" {
			t.Fatalf("view comment %q (%v)", comment, err)
		}
	}
}
