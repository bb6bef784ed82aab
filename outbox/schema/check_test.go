package schema_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

var update = flag.Bool("update", false, "rewrite the golden files of TestCheckGolden")

// TestCheckGolden runs Check on every folder in testdata/check and compares
// its report with the folder's .golden file.
func TestCheckGolden(t *testing.T) {
	dirs, err := filepath.Glob("testdata/check/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		n++
		t.Run(filepath.Base(dir), func(t *testing.T) {
			vs, err := schema.Check(dir)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, v := range vs {
				b.WriteString(v.String() + "\n")
			}
			golden := dir + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run, in outbox/: go test ./schema -run TestCheckGolden -update)", err)
			}
			if b.String() != string(want) {
				t.Errorf("report of %s:\n%s\nwant (%s):\n%s", dir, b.String(), golden, want)
			}
		})
	}
	if n < 2 {
		t.Fatalf("found %d golden cases in testdata/check", n)
	}
}

func TestCheckCompatibleFolderIsClean(t *testing.T) {
	// The golden file could record violations by mistake; this cannot.
	for _, dir := range []string{"testdata/check/compatible", "testdata/schemas"} {
		vs, err := schema.Check(dir)
		if err != nil || len(vs) > 0 {
			t.Fatalf("Check(%s) = %v, %v; want no violations", dir, vs, err)
		}
	}
}
