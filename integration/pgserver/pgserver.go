// Package pgserver starts a throwaway PostgreSQL server with wal_level=logical
// for tests, benchmarks and the demo.
//
// Each Server is a private cluster: its own initdb'd data directory, a free
// port on 127.0.0.1, trust authentication for every database and for
// replication connections, and fsync=off. It is built for speed and
// repeatability, never for keeping data safe.
//
// When the process runs as root, initdb and the server run as the postgres
// OS user (through runuser), because PostgreSQL refuses to run as root.
//
// Test code should use the pgservertest package, which fails the test when
// the server cannot start and stops it when the test ends.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultDatabase is the database Start creates.
const DefaultDatabase = "outbox_test"

// ErrNoBinaries is returned by Start when no PostgreSQL server binaries
// (initdb, pg_ctl, postgres) can be found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries not found; install them with: apt-get install postgresql")

// ErrVersionMissing is returned by Start when Options.Version names a
// major version whose binaries are neither installed nor cached.
var ErrVersionMissing = errors.New("PostgreSQL version not available")

// How long pg_ctl may take to start or stop the server.
const pgCtlTimeout = 60 * time.Second

// Options configures Start. The zero value is ready to use.
type Options struct {
	// Settings are extra postgresql.conf parameters, for example
	// {"logical_decoding_work_mem": "64kB"}. They override the defaults.
	Settings map[string]string

	// Logf, if set, receives one line for each step (initdb, start, stop).
	Logf func(format string, args ...any)

	// HBA are extra pg_hba.conf lines, matched before pgserver's own, which
	// trust every local and loopback connection: for example
	// "hostssl all alice 127.0.0.1/32 cert" to require a client certificate
	// of one user. pgserver itself connects as postgres without TLS.
	HBA []string

	// DataDir, if set, is the data directory to use. It is initialised if
	// it holds no cluster yet, reused otherwise, and kept by Stop. By
	// default the cluster lives in a temporary directory that Stop removes.
	DataDir string

	// Version, if set, is the major version to run ("14" to "18"): the
	// system's /usr/lib/postgresql/<major>/bin, else the newest cached npm
	// package of that major in CacheDir. By default the system's binaries
	// are used (pg_config, else the newest under /usr/lib/postgresql).
	Version string

	// CacheDir is where the npm packages are unpacked; DefaultCacheDir by
	// default.
	CacheDir string
}

// Server is a running PostgreSQL cluster started by Start.
//
// Its methods are safe for concurrent use; the ones that change the
// server's state (Restart, Kill, StartAgain, Stop) run one at a time.
type Server struct {
	binDir   string
	workDir  string // socket, log and pgserver-owned files; removed by Stop
	dataDir  string
	logFile  string
	sockDir  string // "" when the path would be too long for a socket
	port     int
	settings map[string]string
	hba      []string
	logf     func(format string, args ...any)
	osUser   *osUser // non-nil when commands run as the postgres OS user

	mu    sync.Mutex
	state state
}

type state int

const (
	stateRunning state = iota
	stateDown          // after Kill, or a failed Restart/StartAgain
	stateStopped       // after Stop; final
)

// Start initialises a cluster, starts it and creates DefaultDatabase. It
// returns once the server accepts connections. If ctx is cancelled, or any
// step fails, Start stops what it started, removes its temporary files and
// returns the error; the server log tail is part of the error when the
// server itself failed.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if err := validateSettings(opts.Settings); err != nil {
		return nil, err
	}
	for _, l := range opts.HBA {
		if strings.ContainsAny(l, "\n\r\x00") {
			return nil, fmt.Errorf("HBA line %q: must be a single line", l)
		}
	}
	if opts.CacheDir == "" {
		opts.CacheDir = DefaultCacheDir()
	}
	binDir, err := findBinDir(ctx, opts.Version, opts.CacheDir)
	if err != nil {
		return nil, err
	}
	u, err := currentOSUser()
	if err != nil {
		return nil, err
	}
	if u != nil {
		probe := &Server{osUser: u, logf: func(string, ...any) {}}
		if err := probe.ensureSearchable(filepath.Join(binDir, "postgres")); err != nil {
			return nil, fmt.Errorf("PostgreSQL binaries in %s: %w", binDir, err)
		}
	}

	workDir, err := os.MkdirTemp("", "pgserver-")
	if err != nil {
		return nil, fmt.Errorf("create temporary directory: %w", err)
	}
	s := &Server{
		binDir:   binDir,
		workDir:  workDir,
		dataDir:  filepath.Join(workDir, "data"),
		logFile:  filepath.Join(workDir, "postgres.log"),
		settings: opts.Settings,
		hba:      opts.HBA,
		logf:     opts.Logf,
		osUser:   u,
		state:    stateDown,
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if opts.DataDir != "" {
		if s.dataDir, err = filepath.Abs(opts.DataDir); err != nil {
			return nil, errors.Join(fmt.Errorf("data directory: %w", err), os.RemoveAll(workDir))
		}
	}
	if err := s.start(ctx); err != nil {
		return nil, errors.Join(err, s.cleanup())
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	// The unix socket lives beside the log so that a long DataDir cannot
	// push its path over the kernel's limit; without a socket, TCP still
	// works and pg_ctl -w does not need one.
	if len(s.workDir)+len("/.s.PGSQL.65535") < maxSocketPath {
		s.sockDir = s.workDir
	}
	if err := s.prepareDirs(); err != nil {
		return err
	}
	if err := s.initdb(ctx); err != nil {
		return err
	}
	if err := s.writeHBA(); err != nil {
		return err
	}
	if err := s.startOnFreePort(ctx); err != nil {
		return err
	}
	s.state = stateRunning
	return s.ensureDatabase(ctx, DefaultDatabase)
}

// URL returns the connection URL for database db as the postgres superuser,
// for example postgres://postgres@127.0.0.1:54321/outbox_test?sslmode=disable.
func (s *Server) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     "127.0.0.1:" + strconv.Itoa(s.port),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the TCP port the server listens on at 127.0.0.1. It stays the
// same across Restart and StartAgain.
func (s *Server) Port() int { return s.port }

// BinDir returns the directory holding the server binaries in use.
func (s *Server) BinDir() string { return s.binDir }

// DataDir returns the cluster's data directory.
func (s *Server) DataDir() string { return s.dataDir }

// CreateDatabase creates database name and returns its URL. It fails if the
// database exists.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.URL(name), nil
}

func (s *Server) ensureDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// Restart stops the server with a fast shutdown (open sessions are
// disconnected, committed data kept) and starts it again on the same port.
// If ctx is cancelled, pg_ctl is interrupted and the server may be left
// down; Stop still cleans up.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateRunning {
		return fmt.Errorf("restart PostgreSQL: server is %s", s.state)
	}
	s.logf("pgserver: restarting PostgreSQL on port %d", s.port)
	if _, err := s.pgCtl(ctx, "restart", "-m", "fast", "-l", s.logFile); err != nil {
		s.state = stateDown
		return fmt.Errorf("restart PostgreSQL: %w", err)
	}
	return nil
}

// Kill crashes the server: it sends SIGKILL to the postmaster and its child
// processes and returns once they have exited. Committed transactions
// survive (the operating system still holds the written pages); the next
// StartAgain runs crash recovery.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateRunning {
		return fmt.Errorf("kill PostgreSQL: server is %s", s.state)
	}
	pid, err := readPostmasterPID(s.dataDir)
	if err != nil {
		return fmt.Errorf("kill PostgreSQL: %w", err)
	}
	s.logf("pgserver: killing postmaster %d", pid)
	s.state = stateDown
	if err := killTree(pid, s.dataDir, 10*time.Second); err != nil {
		return fmt.Errorf("kill PostgreSQL: %w", err)
	}
	return nil
}

// StartAgain starts the server after Kill (or after a failed Restart) on the
// same port and data directory, and returns once it accepts connections.
func (s *Server) StartAgain(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateDown {
		return fmt.Errorf("start PostgreSQL again: server is %s", s.state)
	}
	if err := clearStalePID(ctx, s.dataDir, 5*time.Second, s.logf); err != nil {
		return fmt.Errorf("start PostgreSQL again: %w", err)
	}
	s.logf("pgserver: starting PostgreSQL again on port %d", s.port)
	if _, err := s.pgCtl(ctx, "start", "-l", s.logFile); err != nil {
		return fmt.Errorf("start PostgreSQL again: %w", err)
	}
	s.state = stateRunning
	return nil
}

// Shutdown stops the server with a fast shutdown, as `pg_ctl stop -m fast`
// does, and keeps the cluster so that StartAgain starts it again. It returns
// once the postmaster has exited, or with an error when pg_ctl gives up or ctx
// is done; the server counts as down either way, and Stop kills what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateRunning {
		return fmt.Errorf("shut down PostgreSQL: server is %s", s.state)
	}
	s.logf("pgserver: shutting down PostgreSQL on port %d", s.port)
	s.state = stateDown
	if _, err := s.pgCtl(ctx, "stop", "-m", "fast"); err != nil {
		return fmt.Errorf("shut down PostgreSQL: %w", err)
	}
	return nil
}

// Stop shuts the server down with a fast shutdown and removes its temporary
// directory (and the data directory unless Options.DataDir was set). If the
// shutdown fails the server is killed. Calling Stop again does nothing and
// returns nil.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stateStopped {
		return nil
	}
	var stopErr error
	if s.state == stateRunning {
		s.logf("pgserver: stopping PostgreSQL on port %d", s.port)
		ctx, cancel := context.WithTimeout(context.Background(), pgCtlTimeout+5*time.Second)
		_, stopErr = s.pgCtl(ctx, "stop", "-m", "fast")
		cancel()
		if stopErr != nil {
			stopErr = fmt.Errorf("stop PostgreSQL: %w", stopErr)
		}
	}
	s.state = stateStopped
	return errors.Join(stopErr, s.cleanup())
}

// cleanup kills whatever server is still running in the data directory and
// removes the temporary directory.
func (s *Server) cleanup() error {
	var errs []error
	if pid, err := readPostmasterPID(s.dataDir); err == nil {
		if err := killTree(pid, s.dataDir, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("kill PostgreSQL: %w", err))
		}
	}
	if err := os.RemoveAll(s.workDir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", s.workDir, err))
	}
	return errors.Join(errs...)
}

// LogTail returns the last n lines of the server log, for a failing test to
// print. It returns "" if there is no log yet.
func (s *Server) LogTail(n int) string {
	return tailFile(s.logFile, n)
}

func (st state) String() string {
	switch st {
	case stateRunning:
		return "running"
	case stateDown:
		return "down"
	case stateStopped:
		return "stopped"
	}
	return "state(" + strconv.Itoa(int(st)) + ")"
}
