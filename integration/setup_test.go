package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// slotsOf lists the replication slots of the test's database.
func (e *env) slotsOf() []string {
	e.t.Helper()
	var slots []string
	err := e.db.QueryRow(e.t.Context(), `SELECT coalesce(array_agg(slot_name::text ORDER BY slot_name), '{}')
		FROM pg_replication_slots WHERE database = current_database()`).Scan(&slots)
	if err != nil {
		e.t.Fatal(err)
	}
	return slots
}

// TestFailedFirstRunLeavesNoSlot: a first run that cannot start (the
// broker is unreachable, the exchange is missing, a template has a typo)
// leaves pg_replication_slots exactly as it was, so no slot keeps WAL for a
// relay that never reads it.
func TestFailedFirstRunLeavesNoSlot(t *testing.T) {
	e := newEnvWith(t, pg, "", "--slot", "")
	// Each case has its own slot, so that one case's leftover slot does not
	// hide the next one's.
	base := func(slot string) string {
		return fmt.Sprintf("postgres:\n  url: %s\n  slot: %s\nhttp:\n  listen: 127.0.0.1:0\n", e.dbURL, slot)
	}
	cases := []struct {
		name, sink, want string
		rabbit           bool
	}{
		{"broker unreachable", "sink:\n  type: kafka\n  kafka:\n    brokers: [127.0.0.1:1]\n", "cannot reach Kafka", false},
		{"template typo", fmt.Sprintf("sink:\n  type: kafka\n  kafka:\n    brokers: [%s]\n    topic: \"outbox.{aggregate_typo}\"\n", e.brokers), "{aggregate_typo}", false},
		{"missing exchange", fmt.Sprintf("sink:\n  type: rabbitmq\n  rabbitmq:\n    url: %s\n    exchange: missing-%d\n    declare: false\n", rabbitURL, time.Now().UnixNano()), "missing-", true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rabbit {
				pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
			}
			before := e.slotsOf()
			out, code := e.cliConfig(base(fmt.Sprintf("fresh_%d", i)) + tc.sink)
			if code != 2 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 2 naming %q; output:\n%s", code, tc.want, out)
			}
			if after := e.slotsOf(); !slices.Equal(before, after) {
				t.Fatalf("pg_replication_slots changed from %v to %v; output:\n%s", before, after, out)
			}
		})
	}

	// The same configuration, fixed, creates the slot and streams.
	p := e.startConfig(base("fresh") + fmt.Sprintf("sink:\n  type: kafka\n  kafka:\n    brokers: [%s]\n", e.brokers))
	p.waitLog(`"streaming"`, 30*time.Second)
	p.stop()
	if got := e.slotsOf(); !slices.Equal(got, []string{"fresh"}) {
		t.Fatalf("slots after a good run: %v, want [fresh]", got)
	}
}

// TestCheckConfigRejectsTemplateTypo: --check-config validates templates
// as run does.
func TestCheckConfigRejectsTemplateTypo(t *testing.T) {
	e := &env{t: t}
	cfg := "postgres:\n  url: postgres://relay@127.0.0.1/shop\nsink:\n  type: kafka\n  kafka:\n    brokers: [127.0.0.1:9092]\n    topic: \"outbox.{aggregate_typo}\"\n"
	out, code := e.cliConfig(cfg, "--check-config")
	if code != 2 || !strings.Contains(out, "sink.kafka.topic") || !strings.Contains(out, "{aggregate_typo}") {
		t.Fatalf("exit %d, want 2 naming sink.kafka.topic and the placeholder; output:\n%s", code, out)
	}
	if n := strings.Count(strings.TrimSpace(out), "\n"); n > 0 {
		t.Errorf("want one line, got:\n%s", out)
	}
}

// TestMigrateConfig: migrate --config creates the slot and publication the
// relay's configuration names, and no slot outboxrelay.
func TestMigrateConfig(t *testing.T) {
	e := newEnvWith(t, pg, "", "--slot", "")
	cfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\n  slot: orders\n  publication: orders_pub\nsink:\n  type: kafka\n  kafka:\n    brokers: [%s]\n", e.dbURL, e.brokers))
	out, code := e.cli("migrate", "--config", cfg)
	if code != 0 {
		t.Fatalf("migrate --config: exit %d: %s", code, out)
	}
	if got := e.slotsOf(); !slices.Equal(got, []string{"orders"}) {
		t.Fatalf("slots: %v, want [orders]; output:\n%s", got, out)
	}
	var pub bool
	if err := e.db.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_publication_tables WHERE pubname = 'orders_pub' AND tablename = 'outbox')").Scan(&pub); err != nil || !pub {
		t.Fatalf("publication orders_pub with outbox: %v %v; output:\n%s", pub, err, out)
	}
	out, code = e.cli("migrate", "--config", cfg, "--slot", "other")
	if code != 2 || !strings.Contains(out, "--slot and --config") {
		t.Fatalf("--slot with --config: exit %d: %s", code, out)
	}
}

// TestMigrateSlotErrorNamesFlag: migrate's slot errors name --slot, the
// setting the user gave, not the config key postgres.slot.
func TestMigrateSlotErrorNamesFlag(t *testing.T) {
	e := newEnvWith(t, pg, "", "--slot", "")
	e.exec("SELECT pg_create_logical_replication_slot('taken', 'test_decoding')")
	out, code := e.cli("migrate", "--database-url", e.dbURL, "--slot", "taken")
	if code != 2 || !strings.Contains(out, "choose another --slot") || strings.Contains(out, "postgres.slot") {
		t.Fatalf("exit %d, want 2 with \"choose another --slot\"; output:\n%s", code, out)
	}
}

// TestMigrateWalLevelReplica: migrate on wal_level=replica cannot create
// the slot, and says so with exit 2 and one line, so that a Job fails.
func TestMigrateWalLevelReplica(t *testing.T) {
	srv, err := startServer(t, map[string]string{"wal_level": "replica"})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dbURL: srv.URL("outbox_test")}
	out, code := e.cli("migrate", "--database-url", e.dbURL)
	if code != 2 {
		t.Fatalf("exit %d, want 2; output:\n%s", code, out)
	}
	var errLines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "outboxrelay:") {
			errLines = append(errLines, l)
		}
	}
	if len(errLines) != 1 || !strings.Contains(errLines[0], "wal_level is replica; set wal_level=logical") {
		t.Fatalf("want one error line naming wal_level=logical; output:\n%s", out)
	}
}

// TestMigrateOwnerWithoutReplication: the tables' owner often lacks
// REPLICATION. migrate then migrates, leaves the slot to the relay's role,
// says so naming that role, and exits 0; asked for a slot by name it fails.
func TestMigrateOwnerWithoutReplication(t *testing.T) {
	ctx := t.Context()
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	owner := "owner_" + name
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	for _, sql := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN NOREPLICATION", owner),
		fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", name, owner),
		fmt.Sprintf("ALTER SCHEMA public OWNER TO %s", owner),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
		c.Exec(context.Background(), fmt.Sprintf("REASSIGN OWNED BY %s TO postgres", owner))
		c.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %s", owner))
		c.Exec(context.Background(), "DROP ROLE "+owner)
	})
	ownerURL := strings.Replace(url, "postgres://postgres@", "postgres://"+owner+"@", 1)
	e := &env{t: t, dbURL: ownerURL}
	out, code := e.cli("migrate", "--database-url", ownerURL)
	if code != 0 {
		t.Fatalf("exit %d, want 0; output:\n%s", code, out)
	}
	for _, want := range []string{"migrated:", "role " + owner + " has no REPLICATION", "the relay's role", "--print-role"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var slots int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&slots); err != nil || slots != 0 {
		t.Errorf("slots: %d %v, want none", slots, err)
	}
	out, code = e.cli("migrate", "--database-url", ownerURL, "--slot", "orders")
	if code != 2 || !strings.Contains(out, "has no REPLICATION") {
		t.Fatalf("--slot orders as %s: exit %d, want 2; output:\n%s", owner, code, out)
	}
}

// outboxDDL is an outbox table as a service made it before migrate ran.
const outboxDDL = `CREATE TABLE public.outbox (
	id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
	payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}', traceparent text,
	schema_version int NOT NULL DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now())`

// indexState returns whether outbox_created_at_idx exists, is valid, and
// its definition.
func indexState(t *testing.T, db *pgx.Conn) (valid bool, def string) {
	t.Helper()
	err := db.QueryRow(t.Context(), `SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE i.indexrelid = to_regclass('public.outbox_created_at_idx')`).Scan(&valid, &def)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	return valid, def
}

// TestMigrateIndexConcurrently: on an outbox table that exists and is in
// use, migrate builds the retention index without blocking the service's
// inserts, and rebuilds an INVALID index a failed concurrent build left.
func TestMigrateIndexConcurrently(t *testing.T) {
	ctx := t.Context()
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), url); err == nil {
			c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			c.Close(context.Background())
		}
	})
	if _, err := db.Exec(ctx, outboxDDL); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dbURL: url, db: db}

	// A service transaction is open on the outbox while migrate runs. A
	// concurrent build waits for it, but new inserts go on meanwhile; a
	// plain CREATE INDEX would queue them behind its SHARE lock.
	open, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'order.created', '{}')"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, code := e.cli("migrate", "--database-url", url, "--slot", "")
		done <- result{out, code}
	}()
	// Wait until migrate waits for the open transaction.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query ILIKE '%outbox_created_at_idx%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("migrate finished (exit %d) while a service transaction was open on the outbox:\n%s", r.code, r.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("migrate did not reach the index build within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ins, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Close(context.Background())
	if _, err := ins.Exec(ctx, "SET statement_timeout = '2s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := ins.Exec(ctx, "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '2', 'order.created', '{}')"); err != nil {
		t.Errorf("an insert while migrate builds the index: %v (the build blocks the service's inserts)", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 0 {
		t.Fatalf("migrate: exit %d:\n%s", r.code, r.out)
	}
	if valid, def := indexState(t, db); !valid || !strings.Contains(def, "(created_at)") {
		t.Fatalf("index after migrate: valid=%v %q", valid, def)
	}

	// A failed concurrent build leaves an INVALID index of that name.
	if _, err := db.Exec(ctx, "DROP INDEX outbox_created_at_idx"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "CREATE UNIQUE INDEX CONCURRENTLY outbox_created_at_idx ON outbox (aggregate_type)"); err == nil {
		t.Fatal("the unique build on duplicate values succeeded")
	}
	if valid, def := indexState(t, db); valid || def == "" {
		t.Fatalf("want an INVALID index left behind, got valid=%v %q", valid, def)
	}
	if out, code := e.cli("migrate", "--database-url", url, "--slot", ""); code != 0 {
		t.Fatalf("migrate: exit %d:\n%s", code, out)
	}
	if valid, def := indexState(t, db); !valid || !strings.Contains(def, "(created_at)") || strings.Contains(def, "UNIQUE") {
		t.Fatalf("index after migrate over an INVALID one: valid=%v %q", valid, def)
	}
	// A rerun changes nothing.
	if out, code := e.cli("migrate", "--database-url", url, "--slot", ""); code != 0 {
		t.Fatalf("rerun: exit %d:\n%s", code, out)
	}
}

// TestInitSQLMatchesPrintRole: deploy/postgres/init.sql, followed by
// `migrate --grant outboxrelay` as the compose file runs it, gives the
// relay's role exactly the attributes and privileges that the SQL
// `migrate --print-role` prints gives a role: no default privileges, no
// write access to the outbox.
func TestInitSQLMatchesPrintRole(t *testing.T) {
	ctx := t.Context()
	name := fmt.Sprintf("it_%d_%d", os.Getpid(), dbCounter.Add(1))
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	e := &env{t: t, dbURL: url, db: db}
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), url); err == nil {
			c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			c.Close(context.Background())
		}
	})
	initSQL, err := os.ReadFile(filepath.Join(deployDir, "postgres", "init.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, string(initSQL), pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("init.sql: %v", err)
	}
	if out, code := e.cli("migrate", "--database-url", url, "--grant", "outboxrelay"); code != 0 {
		t.Fatalf("migrate --grant: exit %d:\n%s", code, out)
	}
	ref := "ref_" + name
	out, code := e.cli("migrate", "--print-role", "--role", ref)
	if code != 0 {
		t.Fatalf("--print-role: exit %d:\n%s", code, out)
	}
	if _, err := db.Exec(ctx, out, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("--print-role SQL: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "DROP OWNED BY "+ref)
		c.Exec(context.Background(), "DROP ROLE "+ref)
	})
	// What a role may do here: its attributes, every ACL entry naming it on
	// the database, schemas, relations and functions, and default ACLs.
	const privileges = `
		SELECT 'role ' || concat_ws(',', CASE WHEN rolsuper THEN 'superuser' END, CASE WHEN rolcanlogin THEN 'login' END,
			CASE WHEN rolreplication THEN 'replication' END, CASE WHEN rolcreatedb THEN 'createdb' END,
			CASE WHEN rolcreaterole THEN 'createrole' END, CASE WHEN rolbypassrls THEN 'bypassrls' END)
		FROM pg_roles WHERE rolname = $1
		UNION ALL
		SELECT 'database ' || a.privilege_type FROM pg_database d, aclexplode(d.datacl) a
		WHERE d.datname = current_database() AND a.grantee = $1::regrole
		UNION ALL
		SELECT 'schema ' || n.nspname || ' ' || a.privilege_type FROM pg_namespace n, aclexplode(n.nspacl) a WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT 'relation ' || c.oid::regclass::text || ' ' || a.privilege_type FROM pg_class c, aclexplode(c.relacl) a WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT 'function ' || p.oid::regprocedure::text || ' ' || a.privilege_type FROM pg_proc p, aclexplode(p.proacl) a WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT 'default ' || d.defaclobjtype::text || ' ' || a.privilege_type FROM pg_default_acl d, aclexplode(d.defaclacl) a WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT 'owns ' || c.oid::regclass::text FROM pg_class c WHERE c.relowner = $1::regrole
		ORDER BY 1`
	read := func(role string) []string {
		rows, err := db.Query(ctx, privileges, role)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got, want := read("outboxrelay"), read(ref)
	if !slices.Equal(got, want) {
		t.Fatalf("init.sql + migrate --grant gives outboxrelay\n  %s\n--print-role gives\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestStatusAll: status --all lists every logical slot with whether it is
// active, the WAL it retains, wal_status and whether a relay checkpoint
// exists, and flags (exit 1) an inactive slot that retains WAL; --watch
// prints one line per interval when its output is not a terminal.
func TestStatusAll(t *testing.T) {
	e := newEnv(t)
	e.exec("SELECT pg_create_logical_replication_slot('orphan', 'pgoutput')")
	e.insert("outbox", "order", "1", 3) // WAL after both slots' restart_lsn
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	defer p.stop()
	e.exec("SELECT pg_switch_wal()") // WAL for the orphan to retain
	e.insert("outbox", "order", "1", 3)
	time.Sleep(500 * time.Millisecond) // a checkpoint record

	out, code := e.cli("status", "--all", "--database-url", e.dbURL, "-o", "json")
	if code != 1 {
		t.Fatalf("exit %d, want 1 for the orphan; output:\n%s", code, out)
	}
	var slots []struct {
		Slot       string `json:"slot"`
		Database   string `json:"database"`
		Active     bool   `json:"active"`
		Retained   int64  `json:"retained_wal_bytes"`
		WALStatus  string `json:"wal_status"`
		Checkpoint *bool  `json:"relay_checkpoint"`
		Flag       string `json:"flag"`
	}
	jsonPart := out[:strings.LastIndex(out, "]")+1]
	if err := json.Unmarshal([]byte(jsonPart), &slots); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	got := map[string]int{}
	for i, s := range slots {
		got[s.Slot] = i
	}
	relaySlot, ok1 := got["outboxrelay"]
	orphan, ok2 := got["orphan"]
	if !ok1 || !ok2 {
		t.Fatalf("want slots outboxrelay and orphan:\n%s", out)
	}
	r, o := slots[relaySlot], slots[orphan]
	if !r.Active || r.Checkpoint == nil || !*r.Checkpoint || r.Flag != "" || r.WALStatus == "" {
		t.Errorf("relay's slot: %+v", r)
	}
	if o.Active || o.Checkpoint == nil || *o.Checkpoint || o.Retained <= 0 || !strings.Contains(o.Flag, "inactive and retains") || !strings.Contains(o.Flag, "pg_drop_replication_slot('orphan')") {
		t.Errorf("orphan slot: %+v", o)
	}
	if !strings.Contains(out, "outboxrelay: unhealthy: orphan: inactive") {
		t.Errorf("no unhealthy line naming the orphan:\n%s", out)
	}

	out, code = e.cli("status", "--all", "--database-url", e.dbURL, "-o", "wide")
	if code != 1 || !strings.Contains(out, "RETAINED WAL") || !strings.Contains(out, "CONFIRMED LSN") || !strings.Contains(out, "orphan") {
		t.Errorf("-o wide: exit %d:\n%s", code, out)
	}

	// --watch, not on a terminal: one line per interval until interrupted.
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, "status", "--all", "--watch", "--interval", "200ms", "--database-url", e.dbURL)
	cmd.Env = cleanEnv()
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	watched, err := cmd.Output()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("--watch: %v, want exit 0 on SIGINT:\n%s", err, watched)
	}
	lines := strings.Split(strings.TrimSpace(string(watched)), "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], "slots=") || !strings.Contains(lines[0], "flagged=1") {
		t.Fatalf("--watch printed:\n%s", watched)
	}
}

// TestCompletionBash: the bash completion script completes commands, dlq
// subcommands and each command's own flags, as the binary lists them.
func TestCompletionBash(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	e := &env{t: t}
	script, code := e.cli("completion", "bash")
	if code != 0 {
		t.Fatalf("completion bash: exit %d:\n%s", code, script)
	}
	complete := func(words ...string) string {
		t.Helper()
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		prog := fmt.Sprintf("%s\nCOMP_WORDS=('%s' %s); COMP_CWORD=%d; _outboxrelay; echo \"${COMPREPLY[*]}\"", script, relayBin, strings.Join(quoted, " "), len(words))
		out, err := exec.Command("bash", "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v:\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"mi"}, "migrate"},
		{[]string{"migrate", "--sl"}, "--slot"},
		{[]string{"migrate", "--gr"}, "--grant"},
		{[]string{"status", "--al"}, "--all"},
		{[]string{"dlq", "re"}, "replay"},
		{[]string{"dlq", "purge", "--be"}, "--before"},
		{[]string{"completion", "fi"}, "fish"},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("complete %v = %q, want %q", tc.words, got, tc.want)
		}
	}
	for _, shell := range []string{"zsh", "fish"} {
		if out, code := e.cli("completion", shell); code != 0 || !strings.Contains(out, "outboxrelay") {
			t.Errorf("completion %s: exit %d:\n%s", shell, code, out)
		}
	}
	if out, code := e.cli("completion", "tcsh"); code != 2 || !strings.Contains(out, "bash, zsh or fish") {
		t.Errorf("completion tcsh: exit %d:\n%s", code, out)
	}
}

// TestMigrateWarnsOfAnotherConfiguredSlot: without --config, migrate warns
// when a configuration in a usual place (./outboxrelay.yaml) names another
// slot than the one it creates, and otherwise says how to drop the slot.
func TestMigrateWarnsOfAnotherConfiguredSlot(t *testing.T) {
	e := newEnvWith(t, pg, "", "--slot", "")
	dir := t.TempDir()
	cfg := fmt.Sprintf("postgres:\n  url: %s\n  slot: orders\nsink:\n  type: kafka\n  kafka:\n    brokers: [%s]\n", e.dbURL, e.brokers)
	if err := writeFile(filepath.Join(dir, "outboxrelay.yaml"), cfg); err != nil {
		t.Fatal(err)
	}
	migrate := func(dir string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), relayBin, "migrate", "--database-url", e.dbURL)
		cmd.Env, cmd.Dir = cleanEnv(), dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("migrate: %v:\n%s", err, out)
		}
		return string(out)
	}
	out := migrate(dir)
	if !strings.Contains(out, "warning: replication slot outboxrelay is not the slot the relay's configuration names (postgres.slot: orders)") ||
		!strings.Contains(out, "pg_drop_replication_slot('outboxrelay')") {
		t.Fatalf("no warning naming both slots:\n%s", out)
	}
	e.exec("SELECT pg_drop_replication_slot('outboxrelay')")
	if out := migrate(t.TempDir()); !strings.Contains(out, "keeps WAL until a relay with postgres.slot: outboxrelay reads it") {
		t.Fatalf("no note on the WAL the slot keeps:\n%s", out)
	}
}
