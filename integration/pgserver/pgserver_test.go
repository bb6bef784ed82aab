package pgserver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := pgservertest.Start(t, pgserver.Options{
		Settings: map[string]string{"logical_decoding_work_mem": "64kB"},
	})
	url := srv.URL(pgserver.DefaultDatabase)

	conn := connect(t, url)
	for setting, want := range map[string]string{
		"wal_level":                 "logical",
		"logical_decoding_work_mem": "64kB",
		"fsync":                     "off",
	} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
	exec(t, conn, "CREATE TABLE outbox (id int PRIMARY KEY)")
	exec(t, conn, "INSERT INTO outbox VALUES (1)")
	exec(t, conn, "SELECT pg_create_logical_replication_slot('test_slot', 'pgoutput')")
	conn.Close(ctx)

	// pg_hba must admit logical (per database) and physical replication
	// connections.
	for _, mode := range []string{"database", "true"} {
		rc, err := pgconn.Connect(ctx, url+"&replication="+mode)
		if err != nil {
			t.Fatalf("replication=%s connection: %v", mode, err)
		}
		if _, err := rc.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil {
			t.Errorf("replication=%s IDENTIFY_SYSTEM: %v", mode, err)
		}
		rc.Close(ctx)
	}

	otherURL, err := srv.CreateDatabase(ctx, "other db")
	if err != nil {
		t.Fatal(err)
	}
	connect(t, otherURL).Close(ctx)
	if _, err := srv.CreateDatabase(ctx, "other db"); err == nil {
		t.Error("CreateDatabase of an existing database succeeded")
	}

	port := srv.Port()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.Port() != port {
		t.Errorf("port changed across Restart: %d -> %d", port, srv.Port())
	}
	conn = connect(t, url)
	exec(t, conn, "INSERT INTO outbox VALUES (2)")
	conn.Close(ctx)

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, url); err == nil {
		c.Close(ctx)
		t.Fatal("connected after Kill")
	}
	if err := srv.Kill(); err == nil {
		t.Error("second Kill succeeded")
	}
	if err := srv.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	conn = connect(t, url)
	var rows, slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Errorf("%d committed rows survived the crash, want 2", rows)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'test_slot'").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 1 {
		t.Error("replication slot lost across Restart and Kill")
	}
	conn.Close(ctx)

	dataDir := srv.DataDir()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data directory after Stop: %v, want it removed", err)
	}
	if err := srv.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestDataDirIsKept(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dataDir := filepath.Join(t.TempDir(), "pgdata")

	srv := pgservertest.Start(t, pgserver.Options{DataDir: dataDir})
	conn := connect(t, srv.URL(pgserver.DefaultDatabase))
	exec(t, conn, "CREATE TABLE kept (id int)")
	conn.Close(ctx)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
		t.Fatalf("caller's data directory after Stop: %v", err)
	}

	srv = pgservertest.Start(t, pgserver.Options{DataDir: dataDir})
	conn = connect(t, srv.URL(pgserver.DefaultDatabase))
	exec(t, conn, "SELECT FROM kept")
	conn.Close(ctx)
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return conn
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(context.WithoutCancel(t.Context()), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}
