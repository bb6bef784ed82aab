package integration

import (
	"os"
	"testing"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o600) }

func startServer(t *testing.T, settings map[string]string) (*pgserver.Server, error) {
	return pgservertest.Start(t, pgserver.Options{Settings: settings}), nil
}
