// Command testreport reads `go test -json` on stdin and prints what plain
// `go test` would: each package's result line, and the whole output of a
// failed test or package. It records every skipped test, with the reason
// it logged, in the file -skips names, and exits 1 when a test, a package
// or a build failed. make test pipes each of its go test runs through it
// and ends by printing the skips (-summary), so that a test that skipped
// for a missing server never reads as a pass.
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
	summary := flag.Bool("summary", false, "print the skips recorded in -skips, grouped by package, and remove the file")
	flag.Parse()
	if *summary {
		if err := printSummary(os.Stdout, *skips); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		return
	}
	failed, err := report(os.Stdin, os.Stdout, *skips)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// report copies the stream's results to w and appends its skips to the
// skips file. It reports whether anything failed.
func report(r io.Reader, w io.Writer, skipsFile string) (failed bool, err error) {
	var skipped []string
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
						if strings.HasPrefix(k, e.Package+"\x00") {
							fmt.Fprint(w, b.String())
							delete(out, k)
						}
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
			}
			if e.Action == "skip" {
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(b)))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	if skipsFile != "" && len(skipped) > 0 {
		f, err := os.OpenFile(skipsFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return true, err
		}
		if _, err := fmt.Fprintln(f, strings.Join(skipped, "\n")); err != nil {
			f.Close()
			return true, err
		}
		if err := f.Close(); err != nil {
			return true, err
		}
	}
	return failed, nil
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

// printSummary prints the recorded skips, grouped by package, and removes
// the file; nothing when no test skipped.
func printSummary(w io.Writer, skipsFile string) error {
	data, err := os.ReadFile(skipsFile)
	if os.IsNotExist(err) {
		fmt.Fprintln(w, "testreport: no test skipped")
		return nil
	}
	if err != nil {
		return err
	}
	byPkg := map[string][]string{}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		pkg, rest, _ := strings.Cut(l, " ")
		byPkg[pkg] = append(byPkg[pkg], rest)
		n++
	}
	pkgs := make([]string, 0, len(byPkg))
	for p := range byPkg {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	fmt.Fprintf(w, "testreport: %d tests SKIPPED, not passed (CI=true makes a missing server a failure):\n", n)
	for _, p := range pkgs {
		fmt.Fprintf(w, "  %s: %d skipped\n", p, len(byPkg[p]))
		for _, t := range byPkg[p] {
			fmt.Fprintf(w, "    %s\n", t)
		}
	}
	return os.Remove(skipsFile)
}
