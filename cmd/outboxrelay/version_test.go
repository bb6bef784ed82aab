package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// make build stamps what git says into the binary, and version --json
// prints it.
func TestMakeBuildStampsVersion(t *testing.T) {
	if raceEnabled {
		// It runs make and the binary it builds, neither under the race
		// detector: the run without -race (make test has both) covers it.
		t.Skip("runs programs only; covered by the run without -race")
	}
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipUnlessCI(t, "%s is not installed", tool)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			skipUnlessCI(t, "git %s: %v (not a checkout?)", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	bin := filepath.Join(t.TempDir(), "outboxrelay")
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "build", "BIN="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	// After the build, so that both see the same tree.
	wantVersion, wantRevision := git("describe", "--tags", "--always", "--dirty"), git("rev-parse", "HEAD")

	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	var got buildInfo
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("version --json printed %q: %v", out, err)
	}
	want := buildInfo{Version: wantVersion, Revision: wantRevision, Go: runtime.Version()}
	if got != want {
		t.Fatalf("version --json = %+v, want %+v", got, want)
	}
	text, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(text), wantVersion) || !strings.Contains(string(text), wantRevision) {
		t.Fatalf("version printed %q (%v), want %s and %s", text, err, wantVersion, wantRevision)
	}
}

// Without ldflags the toolchain's VCS stamp is the revision; the version
// stays dev rather than inventing one.
func TestVersionJSONWithoutLdflags(t *testing.T) {
	var out bytes.Buffer
	if code := runMain([]string{"version", "--json"}, &out, &out); code != exitOK {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("version --json printed %q: %v", out.String(), err)
	}
	for _, k := range []string{"version", "revision", "go"} {
		if _, ok := got[k]; !ok {
			t.Errorf("version --json has no %q: %s", k, out.String())
		}
	}
	if got["go"] != runtime.Version() || got["version"] == "" {
		t.Errorf("version --json = %v", got)
	}
}

// skipUnlessCI skips t with the message, or fails it when the CI
// environment variable is "true": CI runs on a git checkout with make and
// git installed (.ci/services), so a missing one there is a broken setup.
func skipUnlessCI(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; CI must provide make, git and a checkout (see .ci/services)", msg)
	}
	t.Skipf("%s (set CI=true to make this a failure)", msg)
}
