package config

import (
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxrelay/outboxrelay/sinks"
)

var updateReadme = flag.Bool("update-readme", false, "rewrite the configuration reference in docs/configuration.md")

func TestEveryKeyIsDocumented(t *testing.T) {
	seen := map[string]bool{}
	// described holds, per package struct whose Docs describe keys, the
	// paths in it of the keys it declares.
	described := map[reflect.Type]map[string]bool{}
	for _, k := range Keys() {
		seen[k.Path] = true
		if k.Doc == "" {
			where := "internal/config/reference.go"
			if k.docs != nil {
				where = k.docs.String() + ".Docs"
			}
			t.Errorf("key %s has no description in %s", k.Path, where)
		}
		if k.docs != nil {
			if described[k.docs] == nil {
				described[k.docs] = map[string]bool{}
			}
			described[k.docs][k.docKey] = true
		}
	}
	for typ, keys := range described {
		for key := range reflect.Zero(typ).Interface().(documented).Docs() {
			if !keys[key] {
				t.Errorf("%s.Docs describes %s, which is not one of its configuration keys", typ, key)
			}
		}
	}
	for path := range descriptions {
		if !seen[path] {
			t.Errorf("description for %s, which is not a configuration key", path)
		}
	}
	for _, st := range sinks.Types() {
		for key := range st.Docs {
			if path := "sink." + st.Name + "." + key; !seen[path] {
				t.Errorf("sinks.Type.Docs of %s describes %s, which is not a configuration key", st.Name, path)
			}
		}
	}
}

// TestReadmeReference keeps the table of docs/configuration.md equal to
// the struct: run `go test ./internal/config -run TestReadmeReference
// -update-readme` after changing a key.
func TestReadmeReference(t *testing.T) {
	const path = "../../docs/configuration.md"
	const start, end = "<!-- config-keys:start -->\n", "<!-- config-keys:end -->"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, start), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q block", path, start, end)
	}
	want := Reference()
	got := doc[i+len(start) : j]
	if got == want {
		return
	}
	if *updateReadme {
		if err := os.WriteFile(path, []byte(doc[:i+len(start)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("the configuration reference in %s is out of date; run: go test ./internal/config -run TestReadmeReference -update-readme", strings.TrimPrefix(path, "../../"))
}
