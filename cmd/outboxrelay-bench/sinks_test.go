package main

import (
	"strings"
	"testing"
)

const sinkBenchOut = `goos: linux
BenchmarkSink-2         	    5000	    200000 ns/op	      5000 msgs/s
BenchmarkSinkBatch-2    	    5000	     50000 ns/op	     20000 msgs/s
BenchmarkBareClient-2   	    5000	    100000 ns/op	     10000 msgs/s
PASS
`

func TestBenchRates(t *testing.T) {
	r := benchRates(strings.NewReader(sinkBenchOut))
	if r["BenchmarkSink"] != 5000 || r["BenchmarkSinkBatch"] != 20000 || r["BenchmarkBareClient"] != 10000 || len(r) != 3 {
		t.Fatalf("rates %v", r)
	}
	skipped := benchRates(strings.NewReader("BenchmarkSink\n    bench_test.go:20: kinesalite not found\n--- SKIP: BenchmarkSink\nBenchmarkBareClient-2 \t 5000\t 100 ns/op\nPASS\n"))
	if len(skipped) != 0 {
		t.Fatalf("a skipped benchmark and one without msgs/s gave %v", skipped)
	}
}

func TestSinkRowOf(t *testing.T) {
	p := sinkPair{Name: "x", Sink: "BenchmarkSink", Bare: "BenchmarkBareClient"}
	row := sinkRowOf(p, []map[string]float64{
		{"BenchmarkSink": 500, "BenchmarkBareClient": 1000},
		{"BenchmarkSink": 900, "BenchmarkBareClient": 1000},
		{"BenchmarkSink": 800, "BenchmarkBareClient": 2000},
		{"BenchmarkBareClient": 4000}, // the sink side failed
	})
	if *row.SinkRate != 800 || *row.BareRate != 1500 {
		t.Fatalf("medians sink %v bare %v", *row.SinkRate, *row.BareRate)
	}
	// Ratios per repetition 0.5, 0.9, 0.4: the median is 0.5, not 800/1500.
	if *row.Ratio != 0.5 || len(row.RunRatios) != 3 {
		t.Fatalf("ratio %v of %v", *row.Ratio, row.RunRatios)
	}

	missing := sinkRowOf(p, []map[string]float64{{}, {"BenchmarkBareClient": 1000}})
	if missing.SinkRate != nil || missing.Ratio != nil || missing.BareRate == nil {
		t.Fatalf("missing sink side: %+v", missing)
	}
	var b strings.Builder
	printSinkRows(&b, []sinkRow{missing})
	if got := b.String(); strings.Count(got, "(missing)") != 2 || strings.Contains(got, " 0 ") {
		t.Fatalf("printed %q", got)
	}
	if none := sinkRowOf(p, nil); none.SinkRate != nil || none.BareRate != nil || none.Ratio != nil {
		t.Fatalf("no repetitions: %+v", none)
	}
}
