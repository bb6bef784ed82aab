// Package pgservertest adapts pgserver, and the other services the
// end-to-end tests need, to the testing package.
package pgservertest

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
)

// VersionEnv names the environment variable that selects the PostgreSQL
// major version the tests run ("14" to "18"); see pgserver.Options.Version.
const VersionEnv = "OUTBOXRELAY_PG_VERSION"

// Version returns the major version selected by VersionEnv, "" for the
// system's default.
func Version() string { return os.Getenv(VersionEnv) }

// Start starts a PostgreSQL server for t and stops it when t and its
// subtests finish. Failing to start fails the test rather than skipping
// it: a missing PostgreSQL must not turn end-to-end tests green. Unless
// opts.Version is set, the version is the one VersionEnv selects; a version
// whose binaries are missing skips the test, and fails it when the CI
// environment variable is "true". Unless
// opts.Logf is set, the harness logs through t.Logf, and if the test fails
// the end of the server log is printed before the server stops.
func Start(t testing.TB, opts pgserver.Options) *pgserver.Server {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	if opts.Version == "" {
		opts.Version = Version()
	}
	srv, err := pgserver.Start(t.Context(), opts)
	if errors.Is(err, pgserver.ErrVersionMissing) && os.Getenv("CI") != "true" {
		t.Skipf("%v (set CI=true to make this a failure)", err)
	}
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("PostgreSQL log (last lines):\n%s", srv.LogTail(40))
		}
		if err := srv.Stop(); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	})
	return srv
}

// RequireTCP checks that something accepts TCP connections at addr within
// 3 seconds; what names the service in the message ("RabbitMQ"). If
// nothing answers, the test fails when the CI environment variable is
// "true", where the service must be running, and is skipped otherwise.
func RequireTCP(t testing.TB, addr, what string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err == nil {
		conn.Close()
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not reachable at %s (%v); CI must start it before the tests (see .ci/services)", what, addr, err)
	}
	t.Skipf("%s is not reachable at %s (%v); start it to run this test, or set CI=true to make this a failure", what, addr, err)
}
