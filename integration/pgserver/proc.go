package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procState is what /proc says about a process.
type procState int

const (
	procGone    procState = iota
	procZombie            // exited, not yet reaped by its parent
	procRunning           // anything else: running, sleeping, stopped
)

// stateOf returns the state of pid.
func stateOf(pid int) procState {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !fileExists("/proc/self/stat") {
			// No procfs: signal 0 tells alive from gone, not zombies.
			if syscall.Kill(pid, 0) == nil {
				return procRunning
			}
		}
		return procGone
	}
	f, ok := statFields(b)
	if !ok {
		return procGone
	}
	if f[0] == "Z" || f[0] == "X" {
		return procZombie
	}
	return procRunning
}

// statFields returns the fields of /proc/<pid>/stat after the command name,
// starting with the state; the name may hold spaces and parentheses.
func statFields(b []byte) ([]string, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, false
	}
	f := strings.Fields(string(b[i+1:]))
	return f, len(f) >= 2
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(pid)
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if f, ok := statFields(b); ok && f[1] == want {
			kids = append(kids, child)
		}
	}
	return kids
}

// isPostmaster reports whether pid is a live postgres server for dataDir,
// guarding against signalling an unrelated process that reused the pid of
// a dead server.
func isPostmaster(pid int, dataDir string) bool {
	if stateOf(pid) != procRunning {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		// No procfs to check against; the pid file is all there is.
		return !fileExists("/proc/self/cmdline")
	}
	for arg := range strings.SplitSeq(string(b), "\x00") {
		if filepath.Clean(arg) == dataDir {
			return true
		}
	}
	return false
}

// readPostmasterPID returns the pid on the first line of postmaster.pid.
func readPostmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read postmaster.pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("postmaster.pid: bad pid %q", line)
	}
	return pid, nil
}

// killTree sends SIGKILL to the postmaster pid of dataDir and to its
// children, and waits until all have exited. PostgreSQL puts each child in
// its own process group, so killing the postmaster's group would not reach
// them; left alone they would exit on their own once they notice the
// postmaster is gone, but a restart must not race them for the shared
// memory they still hold.
func killTree(pid int, dataDir string, timeout time.Duration) error {
	if !isPostmaster(pid, dataDir) {
		return nil
	}
	pids := append([]int{pid}, childrenOf(pid)...)
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill %d: %w", p, err)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		alive := 0
		for _, p := range pids {
			if stateOf(p) == procRunning {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d server processes still running %s after SIGKILL", alive, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clearStalePID removes the postmaster.pid a killed server left behind when
// it would stop the next start. PostgreSQL ignores a pid file whose process
// is gone, but refuses to start while that pid still exists, which a killed
// postmaster does as a zombie until init reaps it (some container inits
// reap late or never).
func clearStalePID(ctx context.Context, dataDir string, reapWait time.Duration, logf func(string, ...any)) error {
	pid, err := readPostmasterPID(dataDir)
	if err != nil {
		return nil // no pid file: nothing in the way
	}
	wait := time.NewTimer(reapWait)
	defer wait.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		switch stateOf(pid) {
		case procGone:
			return nil
		case procRunning:
			if isPostmaster(pid, dataDir) {
				return fmt.Errorf("postmaster %d is still running", pid)
			}
			// An unrelated process reused the pid.
			return removeStalePID(dataDir, pid, logf)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wait.C:
			return removeStalePID(dataDir, pid, logf)
		case <-tick.C:
		}
	}
}

func removeStalePID(dataDir string, pid int, logf func(string, ...any)) error {
	logf("pgserver: removing postmaster.pid of dead postmaster %d", pid)
	if err := os.Remove(filepath.Join(dataDir, "postmaster.pid")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale postmaster.pid: %w", err)
	}
	return nil
}
