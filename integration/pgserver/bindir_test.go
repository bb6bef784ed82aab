package pgserver

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestNewestBinDir(t *testing.T) {
	root := t.TempDir()
	if _, err := newestBinDir(root); !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("empty root: err = %v, want ErrNoBinaries", err)
	}
	for version, complete := range map[string]bool{"9.6": true, "10": true, "14": true, "16": false, "common": true} {
		bin := filepath.Join(root, version, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		names := []string{"initdb", "pg_ctl", "postgres"}
		if !complete {
			names = names[:1] // a client-only install
		}
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := newestBinDir(root)
	if want := filepath.Join(root, "14", "bin"); got != want || err != nil {
		t.Errorf("newestBinDir = %q, %v; want %q", got, err, want)
	}
}

func TestConfQuoting(t *testing.T) {
	if got, want := quoteConf(`it's C:\x`), `'it''s C:\\x'`; got != want {
		t.Errorf("quoteConf = %s, want %s", got, want)
	}
	for _, bad := range []map[string]string{{"a b": "1"}, {"work_mem": "1\nfsync=on"}} {
		if err := validateSettings(bad); err == nil {
			t.Errorf("validateSettings(%q) accepted it", bad)
		}
	}
}
