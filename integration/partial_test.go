package integration

import (
	"strings"
	"testing"
	"time"
)

// The publication must send every row of an outbox table, and every row
// must be written to the WAL: a row filter or column list on the
// publication (PostgreSQL 15+) and an UNLOGGED partition both hide rows
// from the relay without an error of their own.

const plainOutbox = `CREATE TABLE public.outbox (
	id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
	event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}', traceparent text,
	schema_version int NOT NULL DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now());`

// TestPublicationRowFilter: a publication named as the relay's, created
// beforehand with a row filter, is published whole by migrate, and every
// row arrives; a row filter or column list set later is refused by the
// coverage trigger, and without it the relay stops with the coverage error,
// status exits 1 and a restart refuses, naming migrate as the fix.
func TestPublicationRowFilter(t *testing.T) {
	if v, err := pg.Version(); err != nil || v < 15 {
		t.Skipf("PostgreSQL %d has no publication row filters (%v)", v, err)
	}
	e := newEnvWith(t, pg, plainOutbox+`
		CREATE PUBLICATION outboxrelay FOR TABLE public.outbox WHERE (aggregate_type <> 'x') WITH (publish = 'insert', publish_via_partition_root = true)`)
	var filtered bool
	if err := e.db.QueryRow(t.Context(), `SELECT prqual IS NOT NULL FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
		WHERE p.pubname = 'outboxrelay' AND pr.prrelid = 'public.outbox'::regclass`).Scan(&filtered); err != nil {
		t.Fatal(err)
	}
	if filtered {
		t.Fatalf("after migrate the publication still filters public.outbox")
	}
	if out, code := e.cli("migrate", "--database-url", e.dbURL); code != 0 || strings.Contains(out, "re-added it whole") {
		t.Fatalf("migrate again exited %d, want 0 with nothing to repair:\n%s", code, out)
	}

	c := e.consume("outbox.order", "outbox.x")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := append(e.insert("outbox", "order", "1", 50), e.insert("outbox", "x", "2", 50)...)
	recs := c.waitIDs(ids, 30*time.Second)
	t.Logf("pre-existing row filter, repaired by migrate: committed %d, delivered %d, lost 0, duplicates %d", len(ids), len(ids), duplicates(recs))

	// With the trigger, neither a row filter nor a column list is accepted.
	for _, ddl := range []string{
		`ALTER PUBLICATION outboxrelay SET TABLE outbox WHERE (aggregate_type <> 'x')`,
		`ALTER PUBLICATION outboxrelay SET TABLE outbox (id, aggregate_type, aggregate_id, event_type, payload)`,
	} {
		if _, err := e.db.Exec(t.Context(), ddl); err == nil || !strings.Contains(err.Error(), "row filter or column list") {
			t.Fatalf("%s: %v, want it refused by the coverage trigger", ddl, err)
		}
	}
	more := append(e.insert("outbox", "order", "1", 10), e.insert("outbox", "x", "2", 10)...)
	c.waitIDs(append(ids, more...), 30*time.Second)

	// Without it, the relay stops.
	e.disableCoverageTrigger()
	e.exec(`ALTER PUBLICATION outboxrelay SET TABLE outbox WHERE (aggregate_type <> 'x')`)
	code := p.waitExit(30 * time.Second)
	if code == 0 || !strings.Contains(p.out.String(), "coverage lost") || !strings.Contains(p.out.String(), "row filter WHERE") {
		t.Fatalf("relay exited %d, want non-zero with the coverage error naming the row filter:\n%s", code, tail(p.out.String(), 20))
	}
	e.requireUnhealthy("row filter WHERE")
	out, rc := e.cli("run", "--config", e.config())
	if rc != 2 || !strings.Contains(out, "dropped from publication outboxrelay and added back") {
		t.Fatalf("restart exited %d, want 2 refusing the changed membership:\n%s", rc, out)
	}
	// Accepting the change does not accept the filter.
	out, rc = e.cli("run", "--config", e.config(), "--accept-config-change")
	if rc != 2 || !strings.Contains(out, "row filter WHERE") || !strings.Contains(out, "outboxrelay migrate") {
		t.Fatalf("restart exited %d, want 2 refusing the row filter and naming migrate:\n%s", rc, out)
	}
	e.exec(`ALTER PUBLICATION outboxrelay SET TABLE outbox (id, aggregate_type, aggregate_id, event_type, payload)`)
	out, rc = e.cli("run", "--config", e.config(), "--accept-config-change")
	if rc != 2 || !strings.Contains(out, "column list (id, aggregate_type, aggregate_id, event_type, payload)") {
		t.Fatalf("run with a column list exited %d, want 2 refusing it:\n%s", rc, out)
	}
	out, rc = e.cli("migrate", "--database-url", e.dbURL)
	if rc != 0 || !strings.Contains(out, "re-added it whole") {
		t.Fatalf("migrate exited %d, want 0 naming the repair:\n%s", rc, out)
	}
	t.Logf("row filter set behind the trigger's back: relay exited %d, status exit 1, restart refused; migrate: %s", code, strings.TrimSpace(out))
}

// TestUnloggedPartition: in a partitioned outbox, the coverage trigger
// refuses every way of making a partition UNLOGGED. When the trigger is
// bypassed (session_replication_role = replica) or disabled, the relay
// stops with the coverage error and status exits 1, instead of staying
// ready while the partition's inserts never reach the WAL.
func TestUnloggedPartition(t *testing.T) {
	e := newEnvWith(t, pg, "", "--partitioned")
	var today string
	if err := e.db.QueryRow(t.Context(), `WITH r AS (INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('probe', '0', 'probe', '{}') RETURNING tableoid) SELECT tableoid::regclass::text FROM r`).Scan(&today); err != nil {
		t.Fatal(err)
	}
	if today == "outbox" || today == "outbox_default" {
		t.Fatalf("a row created now went to %s, want today's daily partition", today)
	}
	for _, ddl := range []string{
		`ALTER TABLE ` + today + ` SET UNLOGGED`,
		`CREATE UNLOGGED TABLE public.outbox_u PARTITION OF public.outbox FOR VALUES FROM ('2001-01-01') TO ('2001-01-02')`,
		`BEGIN; CREATE UNLOGGED TABLE public.outbox_a (LIKE public.outbox); ALTER TABLE public.outbox ATTACH PARTITION public.outbox_a FOR VALUES FROM ('2002-01-01') TO ('2002-01-02'); COMMIT`,
	} {
		if _, err := e.db.Exec(t.Context(), ddl); err == nil || !strings.Contains(err.Error(), "UNLOGGED") {
			t.Fatalf("%s: %v, want it refused by the coverage trigger", ddl, err)
		}
		e.exec(`ROLLBACK`) // the failed multi-statement one leaves its transaction open
	}
	e.exec(`CREATE UNLOGGED TABLE public.unrelated (id int)`) // other tables may be unlogged

	c := e.consume("outbox.order")
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 50)
	c.waitIDs(ids, 30*time.Second)

	// A superuser bypasses event triggers with session_replication_role.
	e.exec(`SET session_replication_role = replica`)
	e.exec(`ALTER TABLE ` + today + ` SET UNLOGGED`)
	e.exec(`RESET session_replication_role`)
	lostIDs := e.insert("outbox", "order", "1", 50)
	code := p.waitExit(30 * time.Second)
	if code == 0 || !strings.Contains(p.out.String(), "coverage lost") || !strings.Contains(p.out.String(), "is UNLOGGED") {
		t.Fatalf("relay exited %d, want non-zero with the coverage error naming the unlogged partition:\n%s", code, tail(p.out.String(), 20))
	}
	e.requireUnhealthy("is UNLOGGED")
	out, rc := e.cli("run", "--config", e.config())
	if rc != 2 || !strings.Contains(out, "SET LOGGED") {
		t.Fatalf("restart exited %d, want 2 naming ALTER TABLE ... SET LOGGED:\n%s", rc, out)
	}
	recs := c.records()
	all := append(append([]string(nil), ids...), lostIDs...)
	t.Logf("partition %s set UNLOGGED behind the trigger: committed %d, delivered %d, missing %d; relay exited %d, status exit 1, restart refused",
		today, len(all), len(all)-lost(all, recs), lost(all, recs), code)

	// With the trigger disabled, an unlogged partition created while no
	// relay runs is refused at start.
	e.exec(`ALTER TABLE ` + today + ` SET LOGGED`)
	e.disableCoverageTrigger()
	e.exec(`CREATE UNLOGGED TABLE public.outbox_u PARTITION OF public.outbox FOR VALUES FROM ('2001-01-01') TO ('2001-01-02')`)
	out, rc = e.cli("run", "--config", e.config(), "--accept-config-change")
	if rc != 2 || !strings.Contains(out, "partition public.outbox_u of outbox table public.outbox is UNLOGGED") {
		t.Fatalf("run with an unlogged partition exited %d, want 2 naming it:\n%s", rc, out)
	}
}

// TestForeignPartition: a foreign table attached as a partition of an outbox
// table stores its rows on another server, so its inserts never reach this
// server's WAL. PostgreSQL refuses foreign partitions only when the
// partitioned table has a unique index, which an adopted table may lack.
// The coverage trigger refuses them, and with the trigger disabled the relay
// refuses to start, naming the partition.
func TestForeignPartition(t *testing.T) {
	e := newEnvWith(t, pg, "", "--partitioned")
	e.exec(`ALTER TABLE public.outbox DROP CONSTRAINT outbox_pkey`)
	e.exec(`CREATE EXTENSION IF NOT EXISTS postgres_fdw`)
	e.exec(`CREATE SERVER outboxrelay_test_remote FOREIGN DATA WRAPPER postgres_fdw OPTIONS (dbname 'elsewhere')`)
	foreign := `CREATE FOREIGN TABLE public.outbox_f PARTITION OF public.outbox FOR VALUES FROM ('2001-01-01') TO ('2001-01-02') SERVER outboxrelay_test_remote`
	if _, err := e.db.Exec(t.Context(), foreign); err == nil || !strings.Contains(err.Error(), "foreign table") {
		t.Fatalf("%s: %v, want it refused by the coverage trigger", foreign, err)
	}
	e.disableCoverageTrigger()
	e.exec(foreign)
	out, rc := e.cli("run", "--config", e.config(), "--accept-config-change")
	if rc != 2 || !strings.Contains(out, "partition public.outbox_f of outbox table public.outbox is a foreign table") {
		t.Fatalf("run with a foreign partition exited %d, want 2 naming it:\n%s", rc, out)
	}
}
