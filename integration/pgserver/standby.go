package pgserver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Version returns the server's major version, read from the cluster's
// PG_VERSION file: 15 for PostgreSQL 15.x.
func (s *Server) Version() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.dataDir, "PG_VERSION"))
	if err != nil {
		return 0, fmt.Errorf("read PG_VERSION: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("PG_VERSION %q: %w", b, err)
	}
	return v, nil
}

// StartStandby makes a physical standby of s and starts it. The package's
// binaries hold no pg_basebackup, so the standby is a plain file copy of the
// data directory: StartStandby shuts s down (a fast shutdown) for a
// consistent copy, copies it, starts s again and then the copy, with
// standby.signal and a primary_conninfo (dbname=postgres, application_name
// standby) pointing at s. Replication slots are not copied: the standby
// starts without any. slot, if set, is the physical slot on s that the
// standby streams from (primary_slot_name). s's settings and opts.Settings
// are the standby's settings; opts.Version and opts.CacheDir are ignored
// (the standby runs s's binaries). On failure s may be left down.
func (s *Server) StartStandby(ctx context.Context, slot string, opts Options) (*Server, error) {
	if err := s.Shutdown(ctx); err != nil {
		return nil, fmt.Errorf("make a standby: %w", err)
	}
	workDir, err := os.MkdirTemp("", "pgserver-")
	if err != nil {
		return nil, fmt.Errorf("create temporary directory: %w", err)
	}
	sb := &Server{
		binDir:  s.binDir,
		workDir: workDir,
		dataDir: filepath.Join(workDir, "data"),
		logFile: filepath.Join(workDir, "postgres.log"),
		hba:     opts.HBA,
		logf:    opts.Logf,
		osUser:  s.osUser,
		state:   stateDown,
	}
	if sb.logf == nil {
		sb.logf = func(string, ...any) {}
	}
	if opts.DataDir != "" {
		if sb.dataDir, err = filepath.Abs(opts.DataDir); err != nil {
			return nil, errors.Join(fmt.Errorf("data directory: %w", err), os.RemoveAll(workDir))
		}
	}
	settings := map[string]string{
		"primary_conninfo": fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=standby", s.port),
		"hot_standby":      "on",
		// The standby starts while the primary may not be up yet: retry soon.
		"wal_retrieve_retry_interval": "200ms",
	}
	if slot != "" {
		settings["primary_slot_name"] = slot
	}
	maps.Copy(settings, s.settings)
	maps.Copy(settings, opts.Settings)
	sb.settings = settings
	if err := validateSettings(settings); err != nil {
		return nil, errors.Join(err, os.RemoveAll(workDir))
	}
	if err := sb.copyFrom(ctx, s.dataDir); err != nil {
		return nil, errors.Join(err, sb.cleanup())
	}
	if err := s.StartAgain(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("make a standby: %w", err), sb.cleanup())
	}
	if err := sb.start(ctx); err != nil {
		return nil, errors.Join(err, sb.cleanup())
	}
	return sb, nil
}

// copyFrom copies the primary's data directory into s.dataDir, keeping
// owners and modes, without the primary's pid file and slots, and marks the
// copy as a standby.
func (s *Server) copyFrom(ctx context.Context, primary string) error {
	s.logf("pgserver: copying %s to %s for a standby", primary, s.dataDir)
	if err := os.RemoveAll(s.dataDir); err != nil {
		return fmt.Errorf("make a standby: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", primary, s.dataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("make a standby: copy the data directory: %w\n%s", err, out)
	}
	for _, name := range []string{"postmaster.pid", "postmaster.opts"} {
		if err := os.Remove(filepath.Join(s.dataDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("make a standby: %w", err)
		}
	}
	slots := filepath.Join(s.dataDir, "pg_replslot")
	entries, _ := os.ReadDir(slots)
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(slots, e.Name())); err != nil {
			return fmt.Errorf("make a standby: remove copied slot %s: %w", e.Name(), err)
		}
	}
	return s.writeFile(filepath.Join(s.dataDir, "standby.signal"), nil)
}

// Promote turns a standby into a primary (pg_ctl promote) and returns once
// it accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateRunning {
		return fmt.Errorf("promote PostgreSQL: server is %s", s.state)
	}
	s.logf("pgserver: promoting the standby on port %d", s.port)
	if _, err := s.pgCtl(ctx, "promote"); err != nil {
		return fmt.Errorf("promote PostgreSQL: %w", err)
	}
	return nil
}
