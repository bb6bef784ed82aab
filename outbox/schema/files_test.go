package schema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"order.created/v1.json": `{"type": "object"}`,
		"order.created/v1.avsc": `{"type": "record", "name": "A", "fields": []}`,
		"order.created/v2.avsc": `{"type": "record", "name": "B", "fields": []}`,
		"_shared/money.avsc":    `"string"`,
	})
	avsc, err := Files(dir, "avsc")
	if err != nil {
		t.Fatal(err)
	}
	if len(avsc) != 2 || avsc[Key{"order.created", 2}].Name != "order.created/v2.avsc" ||
		!strings.Contains(string(avsc[Key{"order.created", 1}].Text), `"A"`) {
		t.Errorf("avsc files %v", avsc)
	}
	js, err := Files(dir, "json")
	if err != nil || len(js) != 1 || js[Key{"order.created", 1}].Name != "order.created/v1.json" {
		t.Errorf("json files %v, %v", js, err)
	}
	// The Avro forms beside the JSON Schemas change nothing for Load.
	set, err := Load(dir)
	if err != nil || len(set.Keys()) != 1 {
		t.Errorf("Load with .avsc files: %v, %v", set.Keys(), err)
	}

	if err := os.WriteFile(filepath.Join(dir, "order.created", "latest.avsc"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Files(dir, "avsc"); err == nil || !strings.Contains(err.Error(), "order.created/latest.avsc is not named v<version>.avsc") {
		t.Errorf("misnamed file: %v", err)
	}
	if _, err := Files(dir, "proto"); err == nil {
		t.Error("Files accepted proto")
	}
}
