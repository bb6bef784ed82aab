package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// sinkPair is one row of the sink table: a sink benchmark and the bare
// client publishing the same messages, both in one package.
type sinkPair struct {
	Name, Pkg, Sink, Bare string
}

var sinkPairs = []sinkPair{
	{"webhook", "./sinks/webhook", "BenchmarkSink", "BenchmarkBareClient"},
	{"webhook (batch)", "./sinks/webhook", "BenchmarkSinkBatch", "BenchmarkBareClient"},
	{"sqs", "./sinks/sqs", "BenchmarkSink", "BenchmarkBareClient"},
	{"sns", "./sinks/sns", "BenchmarkSink", "BenchmarkBareClient"},
	{"pubsub", "./sinks/pubsub", "BenchmarkSink", "BenchmarkBareClient"},
	{"kinesis", "./sinks/kinesis", "BenchmarkSink", "BenchmarkBareClient"},
}

// sinkRow is a sink's figures: medians of the repetitions, nil when no
// repetition produced them (the benchmark skipped or failed).
type sinkRow struct {
	Sink     string   `json:"sink"`
	SinkRate *float64 `json:"sink_msgs_per_s"`
	BareRate *float64 `json:"bare_msgs_per_s"`
	// Ratio is the median of the per-repetition ratios sink/bare.
	Ratio     *float64  `json:"ratio"`
	SinkRuns  []float64 `json:"sink_runs"`
	BareRuns  []float64 `json:"bare_runs"`
	RunRatios []float64 `json:"run_ratios"`
	Notes     []string  `json:"notes,omitempty"`
}

// benchRates reads go test -bench output and returns each benchmark's
// msgs/s figure, keyed by its name without the -GOMAXPROCS suffix. A
// benchmark that skipped or failed has no entry.
func benchRates(r io.Reader) map[string]float64 {
	rates := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		for i := 2; i+1 < len(f); i += 2 {
			if f[i+1] != "msgs/s" {
				continue
			}
			if v, err := strconv.ParseFloat(f[i], 64); err == nil && v > 0 {
				rates[name] = v
			}
		}
	}
	return rates
}

// median returns nil for no values.
func median(v []float64) *float64 {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &m
}

// sinkRowOf summarizes the repetitions of one pair; reps holds each
// repetition's rates (benchRates of one run).
func sinkRowOf(p sinkPair, reps []map[string]float64) sinkRow {
	row := sinkRow{Sink: p.Name, SinkRuns: []float64{}, BareRuns: []float64{}, RunRatios: []float64{}}
	for _, r := range reps {
		s, okS := r[p.Sink]
		b, okB := r[p.Bare]
		if okS {
			row.SinkRuns = append(row.SinkRuns, s)
		}
		if okB {
			row.BareRuns = append(row.BareRuns, b)
		}
		if okS && okB {
			row.RunRatios = append(row.RunRatios, s/b)
		}
	}
	row.SinkRate, row.BareRate, row.Ratio = median(row.SinkRuns), median(row.BareRuns), median(row.RunRatios)
	return row
}

// sinkBenchmarks compiles each sink package's tests once and runs its
// pairs count times, the packages and the two sides of a pair
// interleaved, each benchmark for benchtime.
func sinkBenchmarks(ctx context.Context, root string, count int, benchtime string) []sinkRow {
	dir, err := os.MkdirTemp("", "outboxrelay-sinkbench-")
	if err != nil {
		return failedRows(err)
	}
	defer os.RemoveAll(dir)
	bins := map[string]string{}
	notes := map[string][]string{}
	var pkgs []string
	for _, p := range sinkPairs {
		if slices.Contains(pkgs, p.Pkg) {
			continue
		}
		pkgs = append(pkgs, p.Pkg)
		bin := filepath.Join(dir, filepath.Base(p.Pkg)+".test")
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, p.Pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			notes[p.Pkg] = append(notes[p.Pkg], "build failed: "+err.Error())
			continue
		}
		bins[p.Pkg] = bin
	}
	reps := map[string][]map[string]float64{}
	for rep := range count {
		for _, pkg := range pkgs {
			bin, ok := bins[pkg]
			if !ok {
				continue
			}
			var names []string
			for _, p := range sinkPairs {
				if p.Pkg == pkg {
					names = append(names, p.Sink, p.Bare)
				}
			}
			slices.Sort(names)
			names = slices.Compact(names)
			fmt.Printf("== sink bench %s rep %d/%d\n", pkg, rep+1, count)
			var out strings.Builder
			cmd := exec.CommandContext(ctx, bin, "-test.run=^$", "-test.bench=^("+strings.Join(names, "|")+")$", "-test.benchtime="+benchtime)
			cmd.Dir = filepath.Join(root, pkg)
			cmd.Stdout = io.MultiWriter(os.Stdout, &out)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				notes[pkg] = append(notes[pkg], fmt.Sprintf("rep %d: %v", rep+1, err))
			}
			reps[pkg] = append(reps[pkg], benchRates(strings.NewReader(out.String())))
		}
	}
	var rows []sinkRow
	for _, p := range sinkPairs {
		row := sinkRowOf(p, reps[p.Pkg])
		row.Notes = notes[p.Pkg]
		rows = append(rows, row)
	}
	return rows
}

func failedRows(err error) []sinkRow {
	var rows []sinkRow
	for _, p := range sinkPairs {
		rows = append(rows, sinkRowOf(p, nil))
		rows[len(rows)-1].Notes = []string{err.Error()}
	}
	return rows
}

func printSinkRows(out io.Writer, rows []sinkRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(out, "== sinks against their bare client (median of repetitions)")
	fmt.Fprintf(out, "  %-16s %14s %14s %10s\n", "sink", "sink msgs/s", "bare msgs/s", "ratio")
	for _, r := range rows {
		fmt.Fprintf(out, "  %-16s %14s %14s %10s\n", r.Sink, fmtRate(r.SinkRate), fmtRate(r.BareRate), fmtRatio(r.Ratio))
	}
}

func fmtRate(v *float64) string {
	if v == nil {
		return "(missing)"
	}
	return strconv.FormatFloat(*v, 'f', 0, 64)
}

func fmtRatio(v *float64) string {
	if v == nil {
		return "(missing)"
	}
	return strconv.FormatFloat(*v, 'f', 2, 64)
}
