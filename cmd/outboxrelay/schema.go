package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

// cmdSchema runs `outboxrelay schema check DIR`: it prints every
// incompatible change between consecutive versions, with the file and the
// JSON pointer, and exits 1 when there is one, so that a service's CI can
// run it.
func cmdSchema(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("schema check", "schema check DIR",
		"Checks, between consecutive versions of each event type in DIR (EVENT_TYPE/vN.json), that every version is backward compatible with the one before; prints each violation with the file and the JSON pointer and exits 1 when there is one.")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		return &exitError{code: exitOK, err: &helpRequest{fs}}
	}
	if len(args) == 0 || args[0] != "check" {
		return usageErr("schema: want `outboxrelay schema check DIR`; see outboxrelay schema --help")
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: exitOK, err: &helpRequest{fs}}
		}
		return usageErr("schema check: %v", err)
	}
	if fs.NArg() != 1 {
		return usageErr("schema check: want one schema folder, as in `outboxrelay schema check schemas/`")
	}
	dir := fs.Arg(0)
	vs, err := schema.Check(dir)
	if err != nil {
		return usageErr("schema check: %v", err)
	}
	for _, v := range vs {
		v.File = filepath.ToSlash(filepath.Join(dir, v.File))
		fmt.Fprintln(stdout, v)
	}
	if len(vs) > 0 {
		return &exitError{code: exitUnhealthy, err: fmt.Errorf("schema check: %d incompatible changes or broken rules in %s; fix them, or publish the change as a new event type", len(vs), dir)}
	}
	fmt.Fprintf(stdout, "schemas in %s evolve compatibly\n", dir)
	return nil
}
