package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/config"
	"github.com/outboxrelay/outboxrelay/migrations"
)

func cmdMigrate(args []string, stdout io.Writer) error {
	fs := newFlags("migrate")
	url := fs.String("database-url", "", "PostgreSQL URL")
	print := fs.Bool("print", false, "print the SQL instead of running it")
	var o migrations.Options
	fs.StringVar(&o.Table, "table", "public.outbox", "outbox table to create")
	fs.StringVar(&o.Publication, "publication", "outboxrelay", "publication to create")
	fs.BoolVar(&o.Partitioned, "partitioned", false, "create the outbox table range-partitioned by created_at, in daily partitions the relay keeps ready and drops past postgres.retention")
	fs.BoolVar(&o.Debezium, "debezium", false, "also create a Debezium-shaped outbox table (public.outboxevent)")
	slot := fs.String("slot", "outboxrelay", "replication slot to create, so rows written before the relay first runs are kept; empty to skip")
	failoverSlot := fs.Bool("failover-slot", false, "create the slot as a failover slot (PostgreSQL 17+), as postgres.failover_slot does")
	printRoleSQL := fs.Bool("print-role", false, "print the SQL that creates a least-privilege role for the relay, and exit")
	role := fs.String("role", "outboxrelay", "role name for --print-role")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *printRoleSQL {
		return printRole(stdout, *role, o)
	}
	sql, err := migrations.Render(o)
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if *print {
		fmt.Fprint(stdout, sql)
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
	if err := migrations.Apply(ctx, conn, o); err != nil {
		return usageErr("migrate: %v", err)
	}
	tables := []string{o.Table}
	if o.Debezium {
		tables = append(tables, o.DebeziumTable)
	}
	if _, err := conn.Exec(ctx, "SET outboxrelay.migrating = on"); err != nil {
		return usageErr("migrate: %v", err)
	}
	changed, err := cdc.EnsurePublication(ctx, conn, o.Publication, qualifiedTables(tables), nil, nil, cdc.ModeMigrate)
	if err != nil {
		return usageErr("migrate: %v", err)
	}
	if _, err := conn.Exec(ctx, "RESET outboxrelay.migrating"); err != nil {
		return usageErr("migrate: %v", err)
	}
	for _, c := range changed {
		fmt.Fprintf(stdout, "%s\n", c)
	}
	fmt.Fprintf(stdout, "migrated: table %s, schema outboxrelay, publication %s\n", o.Table, o.Publication)
	if o.Partitioned {
		if err := maintainOnce(ctx, dbURL, qualifiedTables([]string{o.Table}), 0, stdout); err != nil {
			return err
		}
	}
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return usageErr("migrate: read wal_level: %v", err)
	}
	if *slot != "" && walLevel != "logical" {
		fmt.Fprintf(stdout, "replication slot %s not created: wal_level is %s; set wal_level=logical, restart PostgreSQL and run migrate again\n", *slot, walLevel)
		*slot = ""
	}
	if *slot != "" {
		// The slot is created outside the migration transaction: PostgreSQL
		// refuses to create one in a transaction that has written.
		if err := cdc.EnsureSlot(ctx, conn, *slot, *failoverSlot); err != nil {
			return usageErr("migrate: %v", err)
		}
		fmt.Fprintf(stdout, "replication slot %s ready: outbox rows are kept for the relay from now on\n", *slot)
	}
	return nil
}

// connect opens a regular connection, failing with one clear line.
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, usageErr("invalid PostgreSQL URL: %v", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, usageErr("cannot connect to PostgreSQL: %v%s", err, tlsHint(err, "sslrootcert and sslmode in postgres.url"))
	}
	return conn, nil
}

// cmdMaintain creates the daily partitions of partitioned outbox tables
// ahead of time and drops those past postgres.retention, once.
func cmdMaintain(args []string, stdout io.Writer) error {
	fs := newFlags("maintain")
	path := fs.String("config", "", "YAML configuration file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(*path, os.LookupEnv)
	if err != nil {
		return usageErr("invalid configuration: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return maintainOnce(ctx, cfg.Postgres.URL, qualifiedTables(cfg.Postgres.Tables), cfg.Postgres.Retention, stdout)
}

func maintainOnce(ctx context.Context, url string, tables []string, retention time.Duration, stdout io.Writer) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return usageErr("invalid PostgreSQL URL: %v", err)
	}
	defer pool.Close()
	done, err := cdc.Maintain(ctx, pool, cdc.MaintainConfig{Tables: tables, MaxAge: retention})
	for _, d := range done {
		fmt.Fprintln(stdout, d)
	}
	if err != nil {
		return usageErr("maintain: %v", err)
	}
	return nil
}
