package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
)

// The version matrix: the core end-to-end tests on every supported
// PostgreSQL version, in one test process. OUTBOXRELAY_PG_MATRIX lists the
// versions ("14 15 16 17 18"); TestMain starts one server per version (the
// package's own serves its version), and TestMatrix runs each test of
// matrixTests on each of them, one version per parallel subtest
// (TestMatrix/pg16/TestKillNineRepeatedly). One process builds the relay
// once and starts the servers at once, where a process per version rebuilt
// and restarted everything five times; make test runs the matrix in its
// integration run and skips the top-level copies of the tests there.
const (
	matrixEnv      = "OUTBOXRELAY_PG_MATRIX"
	matrixTestsEnv = "OUTBOXRELAY_PG_MATRIX_TESTS"
)

// matrixTests are the tests the matrix runs: committed-only delivery with a
// savepoint rolled back in a spilled transaction, kill -9, heartbeats,
// status and metrics, dead letters. make test-matrix requires each of its
// MATRIX_TESTS to pass on each version, by name, so a test renamed here
// cannot drop out unnoticed.
var matrixTests = []func(*testing.T){
	TestOnlyCommittedRowsArrive,
	TestKillNineRepeatedly,
	TestIdleSlotDoesNotPinWAL,
	TestStatusMissingSlot,
	TestMetricsDuringRun,
	TestPoisonMessageDeadLettered,
	TestFirstStartPublishesRowsBeforeSlot,
}

// matrixServer is one version's server, or why it is missing.
type matrixServer struct {
	version string
	srv     *pgserver.Server
	shared  bool  // srv is the package's server, which TestMain stops
	err     error // pgserver.ErrVersionMissing outside CI: the version's tests skip
}

// matrixServers are the servers of OUTBOXRELAY_PG_MATRIX, in its order; nil
// when it is unset. Written by TestMain before the tests run.
var matrixServers []*matrixServer

// startMatrix starts a server with settings for each version that
// OUTBOXRELAY_PG_MATRIX lists, all at once, except the version of the
// package's server def, which the matrix shares. A version whose binaries
// are missing is recorded for its tests to skip, unless CI is "true", where
// it is an error like any other. On error it stops what it started.
func startMatrix(ctx context.Context, def *pgserver.Server, settings map[string]string) ([]*matrixServer, error) {
	versions := strings.Fields(os.Getenv(matrixEnv))
	if len(versions) == 0 {
		return nil, fmt.Errorf("%s=%q lists no version; set it to e.g. \"14 15 16 17 18\"", matrixEnv, os.Getenv(matrixEnv))
	}
	defVersion, err := def.Version()
	if err != nil {
		return nil, fmt.Errorf("version of the package's server: %w", err)
	}
	servers := make([]*matrixServer, len(versions))
	var wg sync.WaitGroup
	for i, v := range versions {
		servers[i] = &matrixServer{version: v}
		if v == strconv.Itoa(defVersion) {
			servers[i].srv, servers[i].shared = def, true
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i].srv, servers[i].err = pgserver.Start(ctx, pgserver.Options{Version: v, Settings: settings})
		}()
	}
	wg.Wait()
	var errs []error
	for _, s := range servers {
		switch {
		case s.err == nil:
			shared := ""
			if s.shared {
				shared = " (the package's server)"
			}
			fmt.Fprintf(os.Stderr, "matrix: PostgreSQL %s from %s%s\n", s.version, s.srv.BinDir(), shared)
		case errors.Is(s.err, pgserver.ErrVersionMissing) && os.Getenv("CI") != "true":
			fmt.Fprintf(os.Stderr, "matrix: skipping PostgreSQL %s: %v (set CI=true to make this a failure)\n", s.version, s.err)
		default:
			errs = append(errs, fmt.Errorf("start PostgreSQL %s for the matrix: %w", s.version, s.err))
		}
	}
	if len(errs) > 0 {
		stopMatrix(servers)
		return nil, errors.Join(errs...)
	}
	return servers, nil
}

// stopMatrix stops the servers all at once, as startMatrix starts them:
// each stop waits for its shutdown checkpoint.
func stopMatrix(servers []*matrixServer) {
	var wg sync.WaitGroup
	for _, s := range servers {
		if s.srv != nil && !s.shared {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.srv.Stop(); err != nil {
					fmt.Fprintf(os.Stderr, "matrix: stop PostgreSQL %s: %v\n", s.version, err)
				}
			}()
		}
	}
	wg.Wait()
}

// serverFor is the server t's database goes on: its version's under
// TestMatrix/pgNN, else the package's.
func serverFor(t *testing.T) *pgserver.Server {
	rest, ok := strings.CutPrefix(t.Name(), "TestMatrix/pg")
	if !ok {
		return pg
	}
	v, _, _ := strings.Cut(rest, "/")
	for _, s := range matrixServers {
		if s.version == v && s.srv != nil {
			return s.srv
		}
	}
	t.Fatalf("no matrix server for PostgreSQL %s", v)
	return nil
}

// TestMatrix runs matrixTests on every version of OUTBOXRELAY_PG_MATRIX,
// the versions in parallel (each on its own server, so the slots do not
// meet), the tests of one version one after the other as they run at the
// top level. Each must pass: a skip fails the version. When
// OUTBOXRELAY_PG_MATRIX_TESTS names the tests (the Makefile's
// MATRIX_TESTS), they must be exactly matrixTests. Without
// OUTBOXRELAY_PG_MATRIX it skips: the same tests run at the top level on
// the package's server.
func TestMatrix(t *testing.T) {
	if matrixServers == nil {
		t.Skipf("%s is not set; make test and make test-matrix set it to the versions to run", matrixEnv)
	}
	var names []string
	for _, fn := range matrixTests {
		names = append(names, testName(fn))
	}
	if list, ok := os.LookupEnv(matrixTestsEnv); ok {
		want := strings.Fields(list)
		slices.Sort(want)
		if got := slices.Sorted(slices.Values(names)); !slices.Equal(got, want) {
			t.Fatalf("%s names %v but matrixTests holds %v; keep the Makefile's MATRIX_TESTS and matrixTests the same", matrixTestsEnv, want, got)
		}
	}
	for _, s := range matrixServers {
		t.Run("pg"+s.version, func(t *testing.T) {
			t.Parallel()
			if s.srv == nil {
				t.Skipf("PostgreSQL %s: %v", s.version, s.err)
			}
			for i, fn := range matrixTests {
				skipped := false
				t.Run(names[i], func(t *testing.T) {
					defer func() { skipped = t.Skipped() }()
					fn(t)
				})
				if skipped {
					t.Errorf("%s skipped on PostgreSQL %s; the matrix requires it to pass", names[i], s.version)
				}
			}
		})
	}
}

// testName is the name of a test function: TestKillNineRepeatedly.
func testName(fn func(*testing.T)) string {
	name := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
	return name[strings.LastIndexByte(name, '.')+1:]
}
