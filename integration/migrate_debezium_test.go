package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// debeziumTable is the table Debezium's outbox event router reads, as its
// users create it; in a schema of its own, which holds no index of the
// relay's (the harness migrates public.outbox first).
const debeziumTable = `CREATE SCHEMA dbz; CREATE TABLE dbz.outboxevent (
	id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
	type varchar(255) NOT NULL, payload jsonb, tracingspancontext varchar(256));`

// debeziumConfig is the test's configuration with the README's column
// mapping for Debezium's table, through a publication and slot of its own.
func (e *env) debeziumConfig(table, name, columns string) string {
	return strings.Replace(e.configText(), "postgres:\n", "postgres:\n  tables: ["+table+"]\n  publication: "+name+"\n  slot: "+name+"\n  columns: "+columns+"\n", 1)
}

const readmeDebeziumColumns = `{id: id, aggregate_type: aggregatetype, aggregate_id: aggregateid, event_type: type, payload: payload, headers: "", traceparent: tracingspancontext, schema_version: "", created_at: ""}`

// TestMigrateDebeziumTable: `migrate --config` with the README's column
// mapping on an existing Debezium table succeeds, and again on a rerun, and
// the relay then delivers every row; `migrate --config --debezium` creates
// the table in Debezium's shape, once, and names it once; a mapping that
// does not fit the table is one clear error.
func TestMigrateDebeziumTable(t *testing.T) {
	e := newEnvWith(t, pg, debeziumTable)
	cfg := e.writeConfig(e.debeziumConfig("dbz.outboxevent", "dbz", readmeDebeziumColumns))
	for run := 1; run <= 2; run++ {
		out, code := e.cli("migrate", "--config", cfg)
		if code != 0 || !strings.Contains(out, "migrated: table dbz.outboxevent, schema outboxrelay, publication dbz") {
			t.Fatalf("migrate --config run %d exited %d, want 0:\n%s", run, code, out)
		}
	}
	c := e.consume("outbox.order")
	p := e.startConfig(e.debeziumConfig("dbz.outboxevent", "dbz", readmeDebeziumColumns))
	p.waitLog(`"streaming"`, 30*time.Second)
	rows, err := e.db.Query(t.Context(), `INSERT INTO dbz.outboxevent (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', (g % 3)::text, 'order.created', jsonb_build_object('seq', g) FROM generate_series(1, 100) g RETURNING id::text`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	recs := c.waitIDs(ids, 30*time.Second)
	p.stop()
	t.Logf("existing Debezium table, migrate --config twice: committed %d, delivered %d, lost 0, duplicates %d", len(ids), len(ids), duplicates(recs))

	// A mapping that names a creation time column the table lacks.
	bad := e.writeConfig(e.debeziumConfig("dbz.outboxevent", "dbz", strings.Replace(readmeDebeziumColumns, `created_at: ""`, `created_at: created_at`, 1)))
	if out, code := e.cli("migrate", "--config", bad); code != 2 || !strings.Contains(out, `has no column "created_at" (postgres.columns.created_at)`) {
		t.Fatalf("migrate with created_at mapped to a missing column exited %d, want 2 naming it:\n%s", code, out)
	}
	// --debezium with the relay's own mapping would create another shape.
	plain := e.writeConfig(strings.Replace(e.configText(), "postgres:\n", "postgres:\n  tables: [dbz.outboxevent]\n  publication: dbz\n  slot: dbz\n", 1))
	if out, code := e.cli("migrate", "--config", plain, "--debezium"); code != 2 || !strings.Contains(out, "docs/debezium.md") {
		t.Fatalf("migrate --config --debezium without Debezium's mapping exited %d, want 2:\n%s", code, out)
	}

	// A table that does not exist yet: --debezium creates it in Debezium's
	// shape, named once.
	fcfg := e.writeConfig(e.debeziumConfig("public.events", "dbz2", readmeDebeziumColumns))
	out, code := e.cli("migrate", "--config", fcfg, "--print", "--debezium")
	if code != 0 || strings.Count(out, `FOR TABLE "public"."events"`) != 1 || strings.Contains(out, `"events", "public"`) {
		t.Fatalf("migrate --print --debezium exited %d, want the table once in the publication:\n%s", code, out)
	}
	for run := 1; run <= 2; run++ {
		out, code = e.cli("migrate", "--config", fcfg, "--debezium")
		if code != 0 || !strings.Contains(out, "migrated: table public.events, schema outboxrelay, publication dbz2\n") {
			t.Fatalf("migrate --config --debezium run %d exited %d, want 0 naming the table once:\n%s", run, code, out)
		}
	}
	var cols []string
	if err := e.db.QueryRow(t.Context(), `SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'public.events'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if strings.Join(cols, ",") != "id,aggregatetype,aggregateid,type,payload,tracingspancontext" {
		t.Fatalf("migrate --config --debezium created columns %v, want Debezium's", cols)
	}
	var published int
	if err := e.db.QueryRow(t.Context(), `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'dbz2'`).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if published != 1 {
		t.Fatalf("publication dbz2 has %d tables, want public.events alone", published)
	}
}
