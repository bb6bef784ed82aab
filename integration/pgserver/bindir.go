package pgserver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// debianRoot is where Debian and Ubuntu install one directory per major
// version: /usr/lib/postgresql/15/bin.
const debianRoot = "/usr/lib/postgresql"

// findBinDir returns the directory of the server binaries: the one
// pg_config names if it holds them, else the newest version under
// debianRoot.
func findBinDir(ctx context.Context) (string, error) {
	// pg_config may come from the client packages only (libpq-dev), so its
	// bindir is checked rather than trusted.
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return newestBinDir(debianRoot)
}

// newestBinDir returns root/<version>/bin for the highest version that has
// the server binaries.
func newestBinDir(root string) (string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return "", ErrNoBinaries
	}
	type candidate struct {
		version []int
		dir     string
	}
	var found []candidate
	for _, e := range entries {
		v, ok := parseVersion(e.Name())
		dir := filepath.Join(root, e.Name(), "bin")
		if ok && hasServerBinaries(dir) {
			found = append(found, candidate{v, dir})
		}
	}
	if len(found) == 0 {
		return "", ErrNoBinaries
	}
	best := slices.MaxFunc(found, func(a, b candidate) int { return slices.Compare(a.version, b.version) })
	return best.dir, nil
}

// parseVersion parses directory names such as "15" and "9.6".
func parseVersion(name string) ([]int, bool) {
	var v []int
	for part := range strings.SplitSeq(name, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		v = append(v, n)
	}
	return v, true
}

func hasServerBinaries(dir string) bool {
	if dir == "" {
		return false
	}
	for _, bin := range []string{"initdb", "pg_ctl", "postgres"} {
		info, err := os.Stat(filepath.Join(dir, bin))
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}
