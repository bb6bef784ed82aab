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
	skips := filepath.Join(t.TempDir(), "skips")
	var out strings.Builder
	failed, err := report(strings.NewReader(stream), &out, skips)
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
	if err := printSummary(&sum, skips); err != nil {
		t.Fatal(err)
	}
	if got := sum.String(); !strings.Contains(got, "1 tests SKIPPED") || !strings.Contains(got, "TestSkip: RabbitMQ is not reachable") {
		t.Errorf("summary:\n%s\nwant TestSkip with its reason", got)
	}
	if _, err := os.Stat(skips); !os.IsNotExist(err) {
		t.Errorf("the summary left %s behind (%v)", skips, err)
	}

	// A clean stream passes and records nothing.
	failed, err = report(strings.NewReader(`{"Action":"pass","Package":"p","Test":"TestOK"}`+"\n"+`{"Action":"pass","Package":"p"}`), &out, skips)
	if err != nil || failed {
		t.Errorf("a passing stream: failed=%v err=%v", failed, err)
	}
	if _, err := os.Stat(skips); !os.IsNotExist(err) {
		t.Errorf("a stream without skips wrote %s", skips)
	}
}
