package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

func TestRetention(t *testing.T) {
	ctx := t.Context()
	conn := connectT(t, "retention")
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id bigserial PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO outbox (created_at) SELECT now() - interval '2 hours' FROM generate_series(1, 25);
		INSERT INTO outbox (created_at) SELECT now() FROM generate_series(1, 5);`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := Retention(rctx, conn, RetentionConfig{Tables: []string{"outbox"}, Column: "created_at", MaxAge: time.Hour, Batch: 10, Interval: time.Hour}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE created_at > now() - interval '1 hour'").Scan(&n); err != nil || n != 5 {
		t.Fatalf("recent rows %d (%v), want 5", n, err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil || n != 5 {
		t.Fatalf("rows %d (%v), want the 5 recent ones", n, err)
	}
}

// connectT starts a PostgreSQL server for t and connects to a new database
// of it, closed when t ends.
func connectT(t *testing.T, database string) *pgx.Conn {
	t.Helper()
	srv := pgservertest.Start(t, pgserver.Options{})
	url, err := srv.CreateDatabase(t.Context(), database)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
