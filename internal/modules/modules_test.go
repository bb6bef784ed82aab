package modules

import (
	"encoding/json"
	"io/fs"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestModulesAgree: every go.mod of the repository requires the same
// version of each module it shares with another, and names the same go
// version. The repository's own modules (replaced by paths) are left out.
func TestModulesAgree(t *testing.T) {
	root := repoRoot(t)
	files := goModFiles(t, root)
	if len(files) < 2 {
		t.Fatalf("found %d go.mod files under %s; the check reads the wrong tree", len(files), root)
	}
	versions := map[string]map[string][]string{} // dependency -> version -> modules
	for _, f := range files {
		rel, _ := filepath.Rel(root, filepath.Dir(f))
		m := readGoMod(t, f)
		add(versions, "go", m.Go, rel)
		for _, r := range m.Require {
			if !strings.HasPrefix(r.Path, "github.com/outboxrelay/outboxrelay") {
				add(versions, r.Path, r.Version, rel)
			}
		}
	}
	for _, dep := range sortedKeys(versions) {
		if byVersion := versions[dep]; len(byVersion) > 1 {
			var parts []string
			for _, v := range sortedKeys(byVersion) {
				parts = append(parts, v+" in "+strings.Join(byVersion[v], ", "))
			}
			t.Errorf("%s: %s; bring every module to the newest of these with `go get %s@<version> && go mod tidy` in its directory", dep, strings.Join(parts, "; "), dep)
		}
	}
}

type goMod struct {
	Go      string
	Require []struct{ Path, Version string }
}

func readGoMod(t *testing.T, file string) goMod {
	t.Helper()
	out, err := exec.Command("go", "mod", "edit", "-json", file).Output()
	if err != nil {
		t.Fatalf("go mod edit -json %s: %v", file, err)
	}
	var m goMod
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return m
}

// repoRoot is the directory of the relay's go.mod, which this package is in.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "go.mod") {
		t.Fatalf("go env GOMOD = %q (%v)", out, err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func goModFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" && !d.IsDir() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func add(versions map[string]map[string][]string, dep, version, module string) {
	if versions[dep] == nil {
		versions[dep] = map[string][]string{}
	}
	versions[dep][version] = append(versions[dep][version], module)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
