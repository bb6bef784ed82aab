package main

import (
	"strings"
	"testing"
)

// A run whose broker held more records than the backlog (a first start
// that also published the table's rows) timed something else: it is left
// out of the summary and of the paired ratios.
func TestMiscountedRunsAreNotTimed(t *testing.T) {
	w := workload{Name: "w", Rows: 1000}
	run := func(consumer string, rep int, seconds float64, delivered int64) measurement {
		m := measurement{Consumer: consumer, Rep: rep, Seconds: seconds, RowsPerSec: float64(w.Rows) / seconds, CPUPer100k: 1, Delivered: delivered}
		m.checkDelivered(w.Rows)
		return m
	}
	wr := &workloadResult{workload: w, Runs: []measurement{
		run(cRelayKafka, 1, 0.01, 2000), // counted twice: far too fast
		run(cRelayKafkaNoOrder, 1, 1, 1000),
		run(cRelayKafka, 2, 2, 1000),
		run(cRelayKafkaNoOrder, 2, 1, 1000),
	}}
	if !wr.Runs[0].Miscounted || wr.Runs[2].Miscounted {
		t.Fatalf("Miscounted = %v, %v; want true for 2000 records of 1000 rows, false for 1000", wr.Runs[0].Miscounted, wr.Runs[2].Miscounted)
	}
	wr.summarize()
	for _, m := range wr.Summary {
		if m.Consumer == cRelayKafka && (m.Reps != 1 || m.RowsPerSec != 500) {
			t.Errorf("relay summary: %d reps at %.0f rows/s; want the one exact run, 1 rep at 500", m.Reps, m.RowsPerSec)
		}
	}
	rate, _, n := pairedRatios(wr.Runs, cRelayKafka, cRelayKafkaNoOrder, 1)
	if n != 1 || rate != 0.5 {
		t.Errorf("pairedRatios = x%.2f of %d pairs; want x0.50 of 1 (the miscounted pair left out)", rate, n)
	}
}

// The 64-aggregate target is judged on the runs made one after the other:
// pg_recvlogical's rate swings from run to run, and the medians of the two
// series can come from different repetitions.
func TestSixtyFourAggregatesJudgedByPairs(t *testing.T) {
	w := workload{Name: "1kb-x100-64agg", Rows: 1000}
	run := func(consumer string, rep int, rate float64) measurement {
		m := measurement{Consumer: consumer, Rep: rep, Seconds: float64(w.Rows) / rate, RowsPerSec: rate, CPUPer100k: 1, Delivered: int64(w.Rows)}
		m.checkDelivered(w.Rows)
		return m
	}
	// Pairs x0.96, x0.96 and x0.73; the medians' ratio is 72/98 = 0.73.
	wr := &workloadResult{workload: w, Runs: []measurement{
		run(cRecvlogical, 1, 100), run(cRelayKafka, 1, 96),
		run(cRecvlogical, 2, 70), run(cRelayKafka, 2, 67),
		run(cRecvlogical, 3, 98), run(cRelayKafka, 3, 72),
	}}
	wr.summarize()
	var line string
	for _, l := range targets(&results{Workloads: []workloadResult{*wr}}) {
		if strings.Contains(l, "64 aggregates") {
			line = l
		}
	}
	if !strings.HasPrefix(line, "met") || !strings.Contains(line, "median of 3 interleaved pairs 0.96") || !strings.Contains(line, "(medians, 0.73)") {
		t.Errorf("64-aggregate target: %q; want it met on the pairs' median 0.96, with the medians' 0.73 shown", line)
	}
	// A relay that is slow in most pairs misses it.
	wr.Runs[1].RowsPerSec, wr.Runs[3].RowsPerSec = 90, 60
	wr.summarize()
	for _, l := range targets(&results{Workloads: []workloadResult{*wr}}) {
		if strings.Contains(l, "64 aggregates") && !strings.HasPrefix(l, "MISSED") {
			t.Errorf("pairs x0.90, x0.86, x0.73: %q, want MISSED", l)
		}
	}
}
