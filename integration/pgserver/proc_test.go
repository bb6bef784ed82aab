package pgserver

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestClearStalePID(t *testing.T) {
	// A child that has exited but is not waited for stays a zombie, like a
	// killed postmaster that init has not reaped yet.
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	for stateOf(zombie.Process.Pid) != procZombie {
		time.Sleep(5 * time.Millisecond)
	}

	for _, tc := range []struct {
		name    string
		pid     int
		removed bool
	}{
		{"zombie", zombie.Process.Pid, true},
		{"pid reused by another process", os.Getpid(), true},
		{"gone", 1 << 22, false}, // above pid_max: PostgreSQL handles it
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pidFile := filepath.Join(dir, "postmaster.pid")
			if err := os.WriteFile(pidFile, []byte(strconv.Itoa(tc.pid)+"\n"+dir+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := clearStalePID(t.Context(), dir, 50*time.Millisecond, t.Logf); err != nil {
				t.Fatal(err)
			}
			_, err := os.Stat(pidFile)
			if removed := errors.Is(err, os.ErrNotExist); removed != tc.removed {
				t.Errorf("postmaster.pid removed = %v, want %v", removed, tc.removed)
			}
		})
	}
}
