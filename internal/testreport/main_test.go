package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A stream of go test -json with a pass, a skip and a failure: the failure's
// output is printed and fails the run, the pass's is not, and the skip is
// recorded with its reason and listed by the summary.
func TestReportAndSummary(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestOK","Output":"    a_test.go:3: noise\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}`,
		`{"Action":"output","Package":"p","Test":"TestSkip","Output":"    a_test.go:4: RabbitMQ is not reachable\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestSkip"}`,
		`{"Action":"output","Package":"p","Test":"TestFail","Output":"    a_test.go:5: boom\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestFail"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}`,
		`{"Action":"fail","Package":"p"}`,
	}, "\n")
	dir := t.TempDir()
	skips, failures := filepath.Join(dir, "skips"), filepath.Join(dir, "failures")
	to := files{skips: skips, failures: failures}
	var out strings.Builder
	failed, err := report(strings.NewReader(stream), &out, to)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("a failed test did not fail the report")
	}
	if got := out.String(); !strings.Contains(got, "boom") || strings.Contains(got, "noise") || !strings.Contains(got, "FAIL\tp") {
		t.Errorf("report printed:\n%s\nwant the failure's output and result line, not the pass's output", got)
	}
	var sum strings.Builder
	failed, err = printSummary(&sum, skips, failures)
	if err != nil {
		t.Fatal(err)
	}
	if got := sum.String(); !strings.Contains(got, "1 tests SKIPPED") || !strings.Contains(got, "TestSkip: RabbitMQ is not reachable") {
		t.Errorf("summary:\n%s\nwant TestSkip with its reason", got)
	}
	if got := sum.String(); !strings.Contains(got, "1 FAILED") || !strings.Contains(got, "p: 1 failed\n    TestFail\n") {
		t.Errorf("summary:\n%s\nwant TestFail listed as failed, once (not its package again)", got)
	}
	if !failed {
		t.Error("the summary of a stream with a failure did not fail")
	}
	for _, f := range []string{skips, failures} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("the summary left %s behind (%v)", f, err)
		}
	}

	// A clean stream passes and records nothing.
	failed, err = report(strings.NewReader(`{"Action":"pass","Package":"p","Test":"TestOK"}`+"\n"+`{"Action":"pass","Package":"p"}`), &out, to)
	if err != nil || failed {
		t.Errorf("a passing stream: failed=%v err=%v", failed, err)
	}
	for _, f := range []string{skips, failures} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("a clean stream wrote %s", f)
		}
	}
	sum.Reset()
	if failed, err := printSummary(&sum, skips, failures); err != nil || failed {
		t.Errorf("the summary of a clean run: failed=%v err=%v\n%s", failed, err, sum.String())
	}
}

// make test runs every suite even when one fails, each through report, and
// ends with one summary: every failed test of every run is in it (the
// first run's failure does not hide the second's), a package that failed
// with no test to name (a build failure, a test binary that did not finish)
// is named, a failed make step is named, and the summary fails.
func TestSummaryListsEveryRunsFailures(t *testing.T) {
	dir := t.TempDir()
	to := files{skips: filepath.Join(dir, "skips"), failures: filepath.Join(dir, "failures")}
	runs := []string{
		// The unit run: a failed test.
		`{"Action":"output","Package":"a","Test":"TestOrder","Output":"    a_test.go:9: message #4768 arrived after #4968\n"}
{"Action":"fail","Package":"a","Test":"TestOrder"}
{"Action":"fail","Package":"a"}`,
		// The race run: a package that does not build, and a test the
		// binary did not finish (a panic).
		`{"ImportPath":"b [b.test]","Action":"build-output","Output":"b/b.go:3:1: syntax error\n"}
{"ImportPath":"b [b.test]","Action":"build-fail"}
{"Action":"fail","Package":"b"}
{"Action":"run","Package":"c","Test":"TestPanics"}
{"Action":"output","Package":"c","Test":"TestPanics","Output":"panic: boom\n"}
{"Action":"fail","Package":"c"}`,
		// A run in which go test itself failed (make's JSON fallback)...
		`{"Action":"fail","Package":"go-test","Test":"exited non-zero without saying why in JSON; see its output above"}`,
		// ... which after a failure it did name is not listed again.
		`{"Action":"fail","Package":"e","Test":"TestE"}
{"Action":"fail","Package":"e"}
{"Action":"fail","Package":"go-test","Test":"exited non-zero without saying why in JSON; see its output above"}`,
		// An inbox module's run: a skip and a pass.
		`{"Action":"output","Package":"d","Test":"TestKafka","Output":"    d_test.go:4: kfake is not there\n"}
{"Action":"skip","Package":"d","Test":"TestKafka"}
{"Action":"pass","Package":"d"}`,
	}
	for i, run := range runs {
		var out strings.Builder
		failed, err := report(strings.NewReader(run), &out, to)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 4; failed != want {
			t.Errorf("run %d: failed=%v, want %v\n%s", i, failed, want, out.String())
		}
	}
	// The step make test's loop records for a target that failed.
	if err := appendLines(to.failures, []string{"make tidy-check"}); err != nil {
		t.Fatal(err)
	}
	var sum strings.Builder
	failed, err := printSummary(&sum, to.skips, to.failures)
	if err != nil {
		t.Fatal(err)
	}
	got := sum.String()
	for _, want := range []string{
		"a: 1 failed\n    TestOrder\n",
		"b: 1 failed\n    (the package: see its output above)\n",
		"c: 1 failed\n    TestPanics (did not finish)\n",
		"go-test: 1 failed\n",
		"e: 1 failed\n    TestE\n",
		"make: 1 failed\n    tidy-check\n",
		"6 FAILED",
		"1 tests SKIPPED",
		"d: 1 skipped\n    TestKafka: kfake is not there\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if !failed {
		t.Errorf("the summary did not fail:\n%s", got)
	}
	if strings.Index(got, "SKIPPED") > strings.Index(got, "FAILED") {
		t.Errorf("the failures are not listed last:\n%s", got)
	}
}
