package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o600) }

func startServer(t *testing.T, settings map[string]string) (*pgserver.Server, error) {
	return pgservertest.Start(t, pgserver.Options{Settings: settings}), nil
}

func insertOnce(ctx context.Context, url, table, aggType, aggID string, n int) ([]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, $2, $1 || '.created', jsonb_build_object('seq', g) FROM generate_series(1, $3) g RETURNING id::text`, table),
		aggType, aggID, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// cliEnv is cli with extra environment variables.
func (e *env) cliEnv(extra []string, args ...string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, args...)
	cmd.Env = append(cleanEnv(), extra...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		e.t.Fatalf("run %v: %v", args, err)
	}
	return string(out), 0
}

func connectT(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
