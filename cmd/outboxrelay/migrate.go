package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/internal/app"
	"github.com/outboxrelay/outboxrelay/internal/config"
	"github.com/outboxrelay/outboxrelay/internal/store"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// usualConfigs are where a relay's configuration usually is: the image's
// default and the working directory. migrate without --config looks there
// to warn when the slot it creates is not the one the relay reads.
var usualConfigs = []string{"/etc/outboxrelay/config.yaml", "outboxrelay.yaml"}

func cmdMigrate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", "migrate --database-url URL | --config FILE [flags]",
		"Create the outbox table, the outboxrelay schema, the publication and the replication slot. Idempotent: a rerun changes nothing and takes no lock.")
	cfgPath := fs.String("config", "", "the relay's YAML configuration: migrate its postgres.tables, publication and slot (postgres.url unless --database-url)")
	url := fs.String("database-url", "", "PostgreSQL URL of the tables' owner (env OUTBOXRELAY_POSTGRES_URL, OUTBOXRELAY_POSTGRES_URL_FILE, DATABASE_URL)")
	print := fs.Bool("print", false, "print the SQL instead of running it")
	var o migrations.Options
	def := cdc.Config{}.WithDefaults() // the configuration's defaults
	fs.StringVar(&o.Table, "table", def.Tables[0], "outbox table to create")
	fs.StringVar(&o.Publication, "publication", def.Publication, "publication to create")
	fs.BoolVar(&o.Partitioned, "partitioned", false, "create the outbox table range-partitioned by created_at, in daily partitions the relay keeps ready and drops past postgres.retention")
	fs.BoolVar(&o.Debezium, "debezium", false, "also create a Debezium-shaped outbox table (public.outboxevent); with --config, create the configuration's table in that shape (postgres.columns must map Debezium's columns)")
	slot := fs.String("slot", def.Slot, "replication slot to create, so rows written before the relay first runs are kept; empty to skip")
	failoverSlot := fs.Bool("failover-slot", false, "create the slot as a failover slot (PostgreSQL 17+), as postgres.failover_slot does")
	printRoleSQL := fs.Bool("print-role", false, "print the SQL that creates a least-privilege role for the relay, and exit")
	role := fs.String("role", "outboxrelay", "role name for --print-role")
	grant := fs.String("grant", "", "after migrating, grant this existing `role` (the relay's) what --print-role grants")
	inboxOnly := fs.Bool("inbox", false, "create a consumer database's inbox tables (the inbox library's Migrate) instead, in --inbox-schema; with --print, print their SQL")
	inboxSchema := fs.String("inbox-schema", inbox.DefaultSchema, "schema of the inbox tables, with --inbox")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *inboxOnly {
		return migrateInbox(fs, *url, *inboxSchema, *print, stdout)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	slotSetting := "--slot"
	var extraTables []string
	if *cfgPath != "" {
		for _, name := range []string{"table", "publication", "slot"} {
			if set[name] {
				return usageErr("migrate: --%s and --config both name it; drop --%s and set it in the configuration", name, name)
			}
		}
		cfg, err := loadConfig(*cfgPath, stderr)
		if err != nil {
			return err
		}
		pg := cfg.Postgres
		o.Table, o.Publication, *slot, slotSetting = pg.Tables[0], pg.Publication, pg.Slot, "postgres.slot"
		extraTables = pg.Tables[1:]
		c := pg.Columns
		o.Columns = migrations.Columns{ID: c.ID, AggregateType: c.AggregateType, AggregateID: c.AggregateID, EventType: c.EventType,
			Payload: c.Payload, Headers: c.Headers, Traceparent: c.Traceparent, SchemaVersion: c.SchemaVersion, CreatedAt: c.CreatedAt}
		if o.Debezium {
			// The relay reads one shape, postgres.columns: with a
			// configuration, the Debezium table is its outbox table.
			if c.AggregateType != "aggregatetype" || c.AggregateID != "aggregateid" || c.EventType != "type" {
				return usageErr("migrate: --debezium with --config creates the configuration's tables in Debezium's shape, and postgres.columns does not map Debezium's aggregatetype, aggregateid and type; set the mapping of docs/debezium.md, or drop --debezium")
			}
			o.Debezium = false
		}
		*failoverSlot = *failoverSlot || pg.FailoverSlot
		if *url == "" { // config.Load has applied OUTBOXRELAY_POSTGRES_URL
			*url = pg.URL
		}
	}
	if *printRoleSQL {
		return printRole(stdout, *role, o)
	}
	sql, err := migrations.Render(o)
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if *print {
		concurrent, err := migrations.ConcurrentSQL(o)
		if err != nil {
			return usageErr("migrate: %v", err)
		}
		fmt.Fprint(stdout, sql, "\n", concurrent)
		return nil
	}
	dbURL, err := databaseURL(*url)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	conn, err := connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Before Apply, which creates the publication when it is missing.
	if err := refuseLatePublication(ctx, conn, *slot, o, extraTables, *cfgPath != ""); err != nil {
		return err
	}
	if err := migrations.Apply(ctx, conn, o); err != nil {
		return usageErr("migrate: %v", err)
	}
	tables := append([]string{o.Table}, extraTables...)
	if o.Debezium {
		if o.DebeziumTable == "" {
			o.DebeziumTable = "public.outboxevent"
		}
		tables = append(tables, o.DebeziumTable)
	}
	tables = distinctTables(tables)
	if _, err := conn.Exec(ctx, "SET outboxrelay.migrating = on"); err != nil {
		return usageErr("migrate: %v", err)
	}
	changed, _, err := cdc.EnsurePublication(ctx, conn, o.Publication, tables, nil, nil, cdc.ModeMigrate)
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if _, err := conn.Exec(ctx, "RESET outboxrelay.migrating"); err != nil {
		return usageErr("migrate: %v", err)
	}
	for _, c := range changed {
		fmt.Fprintf(stdout, "%s\n", c)
	}
	fmt.Fprintf(stdout, "migrated: table %s, schema outboxrelay, publication %s\n", strings.Join(tables, ", "), o.Publication)
	if o.Partitioned {
		if err := maintainOnce(ctx, dbURL, app.QualifiedTables([]string{o.Table}), 0, stdout); err != nil {
			return err
		}
	}
	if *grant != "" {
		if err := grantRole(ctx, conn, *grant, o); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "granted role %s what `outboxrelay migrate --print-role` grants\n", *grant)
	}
	if *slot == "" {
		return nil
	}
	return migrateSlot(ctx, conn, *slot, slotSetting, *failoverSlot, set["slot"], *cfgPath != "", stdout)
}

// refuseLatePublication fails when slot exists and the publication does
// not: migrate creates the publication before the slot, never for a slot
// that is already there (see cdc.LatePublication).
func refuseLatePublication(ctx context.Context, conn *pgx.Conn, slot string, o migrations.Options, extraTables []string, fromConfig bool) error {
	if slot == "" {
		return nil
	}
	pub := o.Publication
	tables := distinctTables(append([]string{o.Table}, extraTables...))
	late, err := cdc.FindLatePublication(ctx, conn, slot, pub, tables, "")
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if late == nil {
		return nil
	}
	// The relay's record, when the schema is there, says whether it has
	// consumed the slot, which changes the fix.
	cp := store.Checkpoint{DB: conn, Slot: slot}
	if cp.Ready(ctx) == nil {
		was, ok, err := cp.Consumer(ctx)
		if err != nil {
			return usageErr("migrate: %v", err)
		}
		if ok {
			late.Consumed = was.Publication
		}
	}
	setting := "--publication"
	if fromConfig {
		setting = "postgres.publication"
	}
	return usageErr("migrate: %v", late.Err(cdc.ModeMigrate, setting))
}

// migrateInbox creates (or with print prints) the inbox tables in a
// consumer's database: the consumer's, not the relay's, so the relay's
// flags do not apply.
func migrateInbox(fs *flag.FlagSet, url, schema string, print bool, stdout io.Writer) error {
	var relayFlags []string
	fs.Visit(func(f *flag.Flag) {
		if !slices.Contains([]string{"inbox", "inbox-schema", "database-url", "print"}, f.Name) {
			relayFlags = append(relayFlags, "--"+f.Name)
		}
	})
	if len(relayFlags) > 0 {
		return usageErr("migrate: --inbox creates a consumer database's inbox tables; %s apply to the relay's database, drop them", strings.Join(relayFlags, ", "))
	}
	if print {
		fmt.Fprint(stdout, inbox.SQL(schema))
		return nil
	}
	return withConn(url, 0, func(ctx context.Context, conn *pgx.Conn) error {
		if err := inbox.Migrate(ctx, conn, schema); err != nil {
			return usageErr("migrate: %v", err)
		}
		fmt.Fprintf(stdout, "migrated: inbox tables and status view in schema %s\n", schema)
		return nil
	})
}

// withConn runs f on a connection to the database flagURL (or the
// environment, as databaseURL says) names, until SIGINT or SIGTERM, or
// timeout if above 0.
func withConn(flagURL string, timeout time.Duration, f func(context.Context, *pgx.Conn) error) error {
	dbURL, err := databaseURL(flagURL)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	conn, err := connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(ctx, conn)
}

// distinctTables returns tables as schema.name, each once, in order.
func distinctTables(tables []string) []string {
	var out []string
	for _, t := range app.QualifiedTables(tables) {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// migrateSlot creates the replication slot, so that outbox rows written
// before the relay first runs are kept for it. It fails when wal_level
// does not allow a slot, or when the slot was asked for by name and the
// role cannot create it. A role without REPLICATION (the tables' owner is
// often not the relay's role) leaves the slot to the relay's first start
// and says so.
func migrateSlot(ctx context.Context, conn *pgx.Conn, slot, setting string, failover, explicit, fromConfig bool, stdout io.Writer) error {
	var walLevel, role string
	var canReplicate bool
	err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_user, rolreplication OR rolsuper
		FROM pg_roles WHERE rolname = current_user`).Scan(&walLevel, &role, &canReplicate)
	if err != nil {
		return usageErr("migrate: read wal_level and role attributes: %v", err)
	}
	if walLevel != "logical" {
		return usageErr("migrate: replication slot %s not created: wal_level is %s; set wal_level=logical, restart PostgreSQL and run migrate again", slot, walLevel)
	}
	exists, err := cdc.CheckSlot(ctx, conn, slot, setting, failover)
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if exists {
		fmt.Fprintf(stdout, "replication slot %s ready: it already existed\n", slot)
		return nil
	}
	if !canReplicate {
		msg := fmt.Sprintf("replication slot %s not created: role %s has no REPLICATION attribute; the relay's role (LOGIN REPLICATION, see `outboxrelay migrate --print-role`) creates it when the relay first starts, and then first publishes the outbox rows written before (postgres.backfill); to keep table-less messages from now on too, run migrate as a role with REPLICATION",
			slot, role)
		if explicit {
			return usageErr("migrate: %s", msg)
		}
		fmt.Fprintln(stdout, msg)
		return nil
	}
	created, err := cdc.EnsureSlot(ctx, conn, slot, setting, failover)
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if !created { // another migrate or relay created it meanwhile
		fmt.Fprintf(stdout, "replication slot %s ready: it already existed\n", slot)
		return nil
	}
	// For an operator reading outboxrelay.checkpoint: when the slot began.
	if err := (store.Checkpoint{DB: conn, Slot: slot}).SlotCreated(ctx); err != nil {
		return usageErr("migrate: %v", err)
	}
	fmt.Fprintf(stdout, "replication slot %s created: outbox rows are kept for the relay from now on\n", slot)
	if fromConfig {
		return nil
	}
	if other := usualConfigSlot(); other != "" && other != slot {
		fmt.Fprintf(stdout, "warning: replication slot %s is not the slot the relay's configuration names (postgres.slot: %s); run `outboxrelay migrate --config FILE`, and drop %s if no relay reads it: SELECT pg_drop_replication_slot('%s');\n",
			slot, other, slot, slot)
		return nil
	}
	fmt.Fprintf(stdout, "note: the slot keeps WAL until a relay with postgres.slot: %s reads it; if none will, drop it: SELECT pg_drop_replication_slot('%s');\n", slot, slot)
	return nil
}

// usualConfigSlot returns the slot a configuration in one of the usual
// places names, or "" when there is none or it cannot be read.
func usualConfigSlot() string {
	for _, path := range usualConfigs {
		if _, err := os.Stat(path); err != nil {
			continue
		}
		if cfg, err := config.Load(path, os.LookupEnv); err == nil {
			return cfg.Postgres.Slot
		}
	}
	return ""
}

// connect opens a regular connection, failing with one clear line.
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	conn, err := app.Connect(ctx, url)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return conn, nil
}

// cmdMaintain creates the daily partitions of partitioned outbox tables
// ahead of time and drops those past postgres.retention, once.
func cmdMaintain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("maintain", "maintain --config FILE",
		"Create the daily partitions of partitioned outbox tables ahead of time and drop those past postgres.retention, once.")
	path := fs.String("config", "", "YAML configuration file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return maintainOnce(ctx, cfg.Postgres.URL, app.QualifiedTables(cfg.Postgres.Tables), cfg.Postgres.Retention, stdout)
}

func maintainOnce(ctx context.Context, url string, tables []string, retention time.Duration, stdout io.Writer) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return usageErr("invalid PostgreSQL URL: %v", err)
	}
	defer pool.Close()
	done, err := store.Maintain(ctx, pool, store.MaintainConfig{Tables: tables, MaxAge: retention})
	for _, d := range done {
		fmt.Fprintln(stdout, d)
	}
	if err != nil {
		return usageErr("maintain: %v", err)
	}
	return nil
}
