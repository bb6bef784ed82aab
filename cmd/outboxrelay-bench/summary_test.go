package main

import "testing"

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
