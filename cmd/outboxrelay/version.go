package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are stamped by make build:
// -ldflags "-X main.version=$(git describe --always --dirty) -X main.commit=$(git rev-parse HEAD)".
// Without them the build's own VCS stamp (debug.ReadBuildInfo) is used.
var (
	version = "dev"
	commit  = ""
)

// buildInfo is what `version --json` prints and the build_info metric is
// labelled with.
type buildInfo struct {
	Version  string `json:"version"`
	Revision string `json:"revision"`
	Go       string `json:"go"`
}

// currentBuild is the version and revision of this binary: the ldflags
// when make build set them, otherwise what the Go toolchain recorded (the
// module version of `go install ...@v1.2.3`, vcs.revision of a build in a
// checkout).
func currentBuild() buildInfo {
	b := buildInfo{Version: version, Revision: commit, Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	if b.Revision == "" {
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && b.Revision != "" {
			b.Revision += "-dirty"
		}
	}
	return b
}

func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "version [--json]", "Print the version, the VCS revision and the Go version the binary was built with.")
	asJSON := fs.Bool("json", false, `print {"version", "revision", "go"}`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	b := currentBuild()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(b)
	}
	rev := b.Revision
	if rev == "" {
		rev = "unknown"
	}
	_, err := fmt.Fprintf(stdout, "outboxrelay %s (revision %s, %s)\n", b.Version, rev, b.Go)
	return err
}
