// Package pgtest starts one throwaway PostgreSQL server per test binary for
// the inbox modules' tests, and gives each test a database of its own.
//
// The inbox modules must not import the relay's module (and with it its
// integration harness), so this is a small harness of their own: initdb
// and pg_ctl from $OUTBOXRELAY_PG_BINDIR, else the newest
// /usr/lib/postgresql/<major>/bin, run as the postgres OS user when the
// tests run as root (PostgreSQL refuses to run as root). fsync is off: the
// server is for speed, not for keeping data.
//
// When no PostgreSQL binaries are found, a test skips, unless CI=true,
// where it fails.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	once    sync.Once
	srv     *server
	srvErr  error
	counter atomic.Int64
)

type server struct {
	bin, dir, data string
	port           int
	asPostgres     bool
}

// Main runs the tests and stops the server, if one was started, before the
// test binary exits. Call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if srv != nil {
		if err := srv.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	return code
}

// Database creates a fresh database on the package's server, starting the
// server on first use, and returns its connection URL.
func Database(t testing.TB) string {
	t.Helper()
	once.Do(func() { srv, srvErr = start() })
	if srvErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL for the inbox tests: %v", srvErr)
		}
		t.Skipf("PostgreSQL for the inbox tests: %v (CI=true makes this a failure)", srvErr)
	}
	name := fmt.Sprintf("inbox_%d_%d", os.Getpid(), counter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.url("postgres"))
	if err != nil {
		t.Fatalf("connect to the test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	return srv.url(name)
}

// Server is a PostgreSQL server of its own, outside a test (the inbox
// bench); Standalone starts it.
type Server struct {
	// URL connects to the database Standalone created.
	URL string
	s   *server
}

// Standalone starts a server with the tests' settings and creates database
// name on it.
func Standalone(name string) (*Server, error) {
	s, err := start()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url("postgres"))
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
		conn.Close(ctx)
	}
	if err != nil {
		_ = s.stop()
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	return &Server{URL: s.url(name), s: s}, nil
}

// PID returns the postmaster's process id, from its data directory.
func (srv *Server) PID() (int, error) {
	b, err := os.ReadFile(filepath.Join(srv.s.data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// Settings are the server's settings that bear on a measurement.
const Settings = "fsync=off, synchronous_commit=off, full_page_writes=off"

// Stop stops the server and removes its files.
func (srv *Server) Stop() error { return srv.s.stop() }

func (s *server) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

func binDir() (string, error) {
	if d := os.Getenv("OUTBOXRELAY_PG_BINDIR"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return va - vb
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("no initdb under /usr/lib/postgresql/*/bin; install postgresql or set OUTBOXRELAY_PG_BINDIR")
}

func start() (*server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "inbox-pg-")
	if err != nil {
		return nil, err
	}
	s := &server{bin: bin, dir: dir, data: filepath.Join(dir, "data"), asPostgres: os.Geteuid() == 0}
	if s.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("tests run as root and there is no postgres OS user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if out, err := s.run("initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", s.port, dir)
	if out, err := s.run("pg_ctl", "start", "-w", "-t", "60", "-D", s.data, "-l", filepath.Join(dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		return nil, fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	return s, nil
}

func (s *server) stop() error {
	out, err := s.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", s.data)
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	return os.RemoveAll(s.dir)
}

func (s *server) run(name string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, name)
	var cmd *exec.Cmd
	if s.asPostgres {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
