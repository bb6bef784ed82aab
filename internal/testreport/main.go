// Command testreport reads `go test -json` on stdin and prints what plain
// `go test` would: each package's result line, and the whole output of a
// failed test or package. It records every skipped test, with the reason
// it logged, in the file -skips names, and every failed test or package in
// the file -failures names, and exits 1 when a test, a package or a build
// failed. make test pipes each of its go test runs through it, goes on
// past a run that failed, and ends with -summary: every failure and every
// skip of all its runs, listed together, and exit status 1 when anything
// failed. So one failing package hides none of the others, and a test
// that skipped for a missing server never reads as a pass.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

func main() {
	skips := flag.String("skips", "", "file to append skipped tests to, one `package test: reason` a line")
	failures := flag.String("failures", "", "file to append failed tests and packages to, one `package test` a line (make test adds `make step` lines)")
	summary := flag.Bool("summary", false, "print the skips and failures recorded in -skips and -failures, grouped by package, remove both files, and exit 1 if anything failed")
	flag.Parse()
	if *summary {
		failed, err := printSummary(os.Stdout, *skips, *failures)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		if failed {
			os.Exit(1)
		}
		return
	}
	failed, err := report(os.Stdin, os.Stdout, files{skips: *skips, failures: *failures})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// goTestExited is the package of the failure make test adds to the stream
// when go test exits non-zero (the Makefile's JSON): recorded only when
// the stream named no failure itself (no such package, a vet failure).
const goTestExited = "go-test"

// files are where report records what it saw; an empty name records nothing.
type files struct{ skips, failures string }

// report copies the stream's results to w and appends its skips and
// failures to their files. It reports whether anything failed.
func report(r io.Reader, w io.Writer, to files) (failed bool, err error) {
	var skipped, failures []string
	testFailed := map[string]bool{}      // packages with a failed test recorded
	out := map[string]*strings.Builder{} // per package and test
	key := func(e event) string { return e.Package + "\x00" + e.Test }
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			// Not an event: passed through. go test's own failures, which
			// it writes to stderr, make test turns into a fail event.
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			failed = true
		case "output":
			if e.Test == "" {
				if e.Output != "PASS\n" { // plain go test prints only the ok line
					fmt.Fprint(w, e.Output)
				}
				continue
			}
			b := out[key(e)]
			if b == nil {
				b = &strings.Builder{}
				out[key(e)] = b
			}
			b.WriteString(e.Output)
		case "pass", "skip", "fail":
			if e.Test == "" {
				if e.Action == "fail" {
					failed = true
					// A test the binary did not finish (a panic, a
					// timeout): its output explains the failure.
					for k, b := range out {
						if test, ok := strings.CutPrefix(k, e.Package+"\x00"); ok {
							fmt.Fprint(w, b.String())
							delete(out, k)
							failures = append(failures, fmt.Sprintf("%s %s (did not finish)", e.Package, test))
							testFailed[e.Package] = true
						}
					}
					// A build, vet or TestMain failure fails the package
					// with no test to name.
					if !testFailed[e.Package] {
						failures = append(failures, fmt.Sprintf("%s (the package: see its output above)", e.Package))
					}
				}
				continue
			}
			b := out[key(e)]
			delete(out, key(e))
			if e.Action == "fail" {
				failed = true
				if b != nil {
					fmt.Fprint(w, b.String())
				}
				if e.Package != goTestExited || len(failures) == 0 {
					failures = append(failures, e.Package+" "+e.Test)
				}
				testFailed[e.Package] = true
			}
			if e.Action == "skip" {
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(b)))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	if err := appendLines(to.skips, skipped); err != nil {
		return true, err
	}
	if err := appendLines(to.failures, failures); err != nil {
		return true, err
	}
	return failed, nil
}

// appendLines appends lines to the file name, creating it; nothing when
// name is empty or there are no lines.
func appendLines(name string, lines []string) error {
	if name == "" || len(lines) == 0 {
		return nil
	}
	f, err := os.OpenFile(name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, strings.Join(lines, "\n")); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// reason is the first line a skipped test logged other than go test's own
// === and --- lines, without the file:line prefix.
func reason(b *strings.Builder) string {
	if b == nil {
		return "no reason logged"
	}
	for _, l := range strings.Split(b.String(), "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		if _, msg, ok := strings.Cut(t, ": "); ok && strings.Contains(t[:len(t)-len(msg)], ".go:") {
			t = msg
		}
		return t
	}
	return "no reason logged"
}

// printSummary prints the recorded skips, then the recorded failures, each
// grouped by package, removes both files and reports whether anything
// failed. The failures come last, where a reader of make test's output
// looks first.
func printSummary(w io.Writer, skipsFile, failuresFile string) (failed bool, err error) {
	skips, err := readLines(skipsFile)
	if err != nil {
		return true, err
	}
	if len(skips) == 0 {
		fmt.Fprintln(w, "testreport: no test skipped")
	} else {
		fmt.Fprintf(w, "testreport: %d tests SKIPPED, not passed (CI=true makes a missing server a failure):\n", len(skips))
		printGrouped(w, skips, "skipped")
	}
	failures, err := readLines(failuresFile)
	if err != nil {
		return true, err
	}
	if len(failures) == 0 {
		fmt.Fprintln(w, "testreport: nothing failed")
	} else {
		fmt.Fprintf(w, "testreport: %d FAILED (each one's output is above):\n", len(failures))
		printGrouped(w, failures, "failed")
	}
	for _, f := range []string{skipsFile, failuresFile} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return true, err
		}
	}
	return len(failures) > 0, nil
}

// readLines returns the file's non-empty lines; none when name is empty or
// the file does not exist (nothing was recorded).
func readLines(name string) ([]string, error) {
	if name == "" {
		return nil, nil
	}
	data, err := os.ReadFile(name)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// printGrouped prints `package rest` lines under their package, packages
// sorted, each line in the order recorded.
func printGrouped(w io.Writer, lines []string, what string) {
	byPkg := map[string][]string{}
	for _, l := range lines {
		pkg, rest, _ := strings.Cut(l, " ")
		byPkg[pkg] = append(byPkg[pkg], rest)
	}
	pkgs := make([]string, 0, len(byPkg))
	for p := range byPkg {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Fprintf(w, "  %s: %d %s\n", p, len(byPkg[p]), what)
		for _, t := range byPkg[p] {
			fmt.Fprintf(w, "    %s\n", t)
		}
	}
}
