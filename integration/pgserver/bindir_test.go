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

func TestVersionBinDir(t *testing.T) {
	root, cache := t.TempDir(), t.TempDir()
	mk := func(dir string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk(filepath.Join(root, "15", "bin"))
	mk(filepath.Join(cache, "15.18.0-beta.17", "native", "bin"))
	mk(filepath.Join(cache, "17.9.0-beta.17", "native", "bin"))
	mk(filepath.Join(cache, "17.10.0-beta.17", "native", "bin"))
	mk(filepath.Join(cache, "1.0.0", "native", "bin"))
	if err := os.MkdirAll(filepath.Join(cache, "17.11.0-beta.18", "native"), 0o755); err != nil {
		t.Fatal(err) // an interrupted unpack: no binaries
	}
	for major, want := range map[string]string{
		"15": filepath.Join(root, "15", "bin"), // the system's first
		"17": filepath.Join(cache, "17.10.0-beta.17", "native", "bin"),
	} {
		if got, err := versionBinDir(root, cache, major); got != want || err != nil {
			t.Errorf("versionBinDir(%s) = %q, %v; want %q", major, got, err, want)
		}
	}
	if _, err := versionBinDir(root, cache, "16"); !errors.Is(err, ErrVersionMissing) {
		t.Errorf("versionBinDir(16) err = %v, want ErrVersionMissing", err)
	}
	if _, err := versionBinDir(root, cache, "17.1"); err == nil || errors.Is(err, ErrVersionMissing) {
		t.Errorf("versionBinDir(17.1) err = %v, want a bad-version error", err)
	}
}

// TestCachedBinDirAnyVersion: without system binaries, make demo uses the
// newest cached npm package of any version.
func TestCachedBinDirAnyVersion(t *testing.T) {
	cache := t.TempDir()
	if got := cachedBinDir(cache, ""); got != "" {
		t.Fatalf("empty cache: cachedBinDir = %q, want none", got)
	}
	for _, name := range []string{"16.14.0-beta.17", "17.10.0-beta.17", "18.4.0-beta.17"} {
		bin := filepath.Join(cache, name, "native", "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		names := []string{"initdb", "pg_ctl", "postgres"}
		if name == "18.4.0-beta.17" {
			names = names[:1] // an interrupted unpack
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(bin, n), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, want := cachedBinDir(cache, ""), filepath.Join(cache, "17.10.0-beta.17", "native", "bin"); got != want {
		t.Errorf("cachedBinDir(any) = %q, want %q", got, want)
	}
	if got, want := cachedBinDir(cache, "16"), filepath.Join(cache, "16.14.0-beta.17", "native", "bin"); got != want {
		t.Errorf("cachedBinDir(16) = %q, want %q", got, want)
	}
}
