package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// pipelinesResult is the many-pipelines section of the results file: what
// an idle pipeline costs a process, and what one process relaying many
// busy pipelines does against as many processes with one each.
type pipelinesResult struct {
	Idle  *idleResult `json:"idle,omitempty"`
	Busy  *busyResult `json:"busy,omitempty"`
	Notes []string    `json:"notes,omitempty"`
}

// idleResult compares a process of Pipelines idle pipelines with a process
// of one, in the same run: the difference per added pipeline.
type idleResult struct {
	Pipelines     int     `json:"pipelines"`
	WindowSeconds float64 `json:"window_seconds"`
	// RSS after the settle time; CPU over the window that follows.
	RSSMBOne             float64 `json:"rss_mb_one_pipeline"`
	RSSMBMany            float64 `json:"rss_mb_many_pipelines"`
	CPUSecondsOne        float64 `json:"cpu_s_one_pipeline"`
	CPUSecondsMany       float64 `json:"cpu_s_many_pipelines"`
	RSSMBPerPipeline     float64 `json:"rss_mb_per_idle_pipeline"`
	CPUPercentPerPipline float64 `json:"cpu_percent_per_idle_pipeline"`
	OthersBusy           float64 `json:"others_busy_share"`
}

// busyResult is the same backlog (one database, one WAL) drained by
// Pipelines pipelines of one process and by Pipelines processes of one
// pipeline each, each pipeline on a slot of its own, interleaved.
type busyResult struct {
	Pipelines int       `json:"pipelines"`
	RowsEach  int       `json:"rows_each"`
	Payload   int       `json:"payload_bytes"`
	Runs      []busyRun `json:"runs"`
	// Medians of the total rows/s (all pipelines' rows over the run's time).
	RowsPerSecOne      float64 `json:"rows_per_sec_one_process"`
	RowsPerSecSeparate float64 `json:"rows_per_sec_separate_processes"`
	// Ratio is RowsPerSecOne / RowsPerSecSeparate.
	Ratio float64 `json:"ratio_one_to_separate"`
}

type busyRun struct {
	Mode string `json:"mode"` // "one process" or "separate processes"
	Rep  int    `json:"rep"`
	// Seconds runs from launching the process(es) to every slot's
	// confirmed_flush_lsn passing the backlog: startup is counted.
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_sec"`
	// The relay processes' CPU and summed peak RSS.
	CPUSeconds float64 `json:"cpu_s"`
	PeakRSSMB  float64 `json:"peak_rss_mb"`
	Delivered  int64   `json:"delivered"`
	OthersBusy float64 `json:"others_busy_share"`
}

const (
	modeOne      = "one process"
	modeSeparate = "separate processes"
)

// runPipelines measures the idle and the busy pipelines.
func runPipelines(ctx context.Context, env *benchEnv, o options) *pipelinesResult {
	res := &pipelinesResult{}
	fmt.Printf("== pipelines: %d idle in one process against one; %d busy in one process against %d processes\n",
		o.idlePipelines, o.busyPipelines, o.busyPipelines)
	idle, err := runIdlePipelines(ctx, env, o)
	if err != nil {
		res.Notes = append(res.Notes, "idle pipelines: "+err.Error())
		fmt.Println("!! idle pipelines:", err)
	}
	res.Idle = idle
	busy, err := runBusyPipelines(ctx, env, o)
	if err != nil {
		res.Notes = append(res.Notes, "busy pipelines: "+err.Error())
		fmt.Println("!! busy pipelines:", err)
	}
	res.Busy = busy
	return res
}

// pipelinesConfig is a relay configuration of one pipeline per slot, all
// in the database at url, into the broker.
func pipelinesConfig(url, broker, listen string, slots []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "postgres:\n  url: %s\n  status_interval: 100ms\nsink:\n  type: kafka\n  kafka:\n    brokers: [%s]\nhttp:\n  listen: %s\npipelines:\n", url, broker, listen)
	for _, s := range slots {
		fmt.Fprintf(&b, "  - name: %s\n    postgres: {slot: %s}\n", strings.ReplaceAll(s, "_", "-"), s)
	}
	return b.String()
}

func runIdlePipelines(ctx context.Context, env *benchEnv, o options) (*idleResult, error) {
	const db = "bench_idle_pipelines"
	url, err := env.prepareDatabase(ctx, db)
	if err != nil {
		return nil, err
	}
	defer env.dropDatabase(db)
	var many []string
	for i := range o.idlePipelines {
		many = append(many, fmt.Sprintf("idle_%d", i))
	}
	if err := createSlots(ctx, url, append([]string{"idle_one"}, many...)); err != nil {
		return nil, err
	}
	kb, err := newBenchKafka()
	if err != nil {
		return nil, err
	}
	defer kb.close()
	r := &idleResult{Pipelines: o.idlePipelines, WindowSeconds: o.idleWindow.Seconds()}
	busy0 := machineBusy()
	t0 := time.Now()
	rssOne, cpuOne, err := idleProcess(ctx, env, "idle-one", url, kb.addr, []string{"idle_one"}, o.idleWindow)
	if err != nil {
		return nil, err
	}
	rssMany, cpuMany, err := idleProcess(ctx, env, "idle-many", url, kb.addr, many, o.idleWindow)
	if err != nil {
		return nil, err
	}
	r.OthersBusy = othersShare(machineBusy()-busy0, cpuOne+cpuMany, time.Since(t0))
	r.RSSMBOne, r.RSSMBMany = rssOne, rssMany
	r.CPUSecondsOne, r.CPUSecondsMany = cpuOne.Seconds(), cpuMany.Seconds()
	added := float64(o.idlePipelines - 1)
	r.RSSMBPerPipeline = (rssMany - rssOne) / added
	r.CPUPercentPerPipline = (cpuMany - cpuOne).Seconds() / added / o.idleWindow.Seconds() * 100
	fmt.Printf("   idle: 1 pipeline %.1f MB RSS, %.2f CPU s; %d pipelines %.1f MB, %.2f CPU s over %s: %.2f MB and %.3f%% of a CPU per idle pipeline\n",
		rssOne, cpuOne.Seconds(), o.idlePipelines, rssMany, cpuMany.Seconds(), o.idleWindow, r.RSSMBPerPipeline, r.CPUPercentPerPipline)
	return r, nil
}

// othersShare is the share of the machine's CPU that neither the relays
// nor this process used during elapsed.
func othersShare(busy, relays, elapsed time.Duration) float64 {
	others := busy - relays
	if elapsed <= 0 || others < 0 {
		return 0
	}
	return others.Seconds() / (elapsed.Seconds() * float64(runtime.NumCPU()))
}

// idleProcess starts a relay of these pipelines, waits until every one
// streams and 5 s more, and returns its RSS then and its CPU time over
// window.
func idleProcess(ctx context.Context, env *benchEnv, name, url, broker string, slots []string, window time.Duration) (rssMB float64, cpu time.Duration, err error) {
	listen, err := freeAddr()
	if err != nil {
		return 0, 0, err
	}
	p, err := startRelay(env, name, pipelinesConfig(url, broker, listen, slots), slots[0])
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if stopErr := p.stop(); err == nil {
			err = stopErr
		}
	}()
	if err := waitHTTP(ctx, p, "http://"+listen+"/readyz", 2*time.Minute); err != nil {
		return 0, 0, err
	}
	select {
	case <-time.After(5 * time.Second): // startup's garbage collected, the heartbeats begun
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	pid := p.cmd.Process.Pid
	before := readProc(pid)
	rss := currentRSSMB(pid)
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	after := readProc(pid)
	if !before.ok || !after.ok {
		return 0, 0, fmt.Errorf("relay %s exited (log %s)", name, p.log)
	}
	return rss, after.cpu - before.cpu, nil
}

// currentRSSMB is pid's resident set (VmRSS) in MB, 0 when unreadable.
func currentRSSMB(pid int) float64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// waitHTTP waits until url answers 200, or the relay exits.
func waitHTTP(ctx context.Context, p *relayProc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("relay exited: %v (log %s)", p.err, p.log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer 200 within %s (log %s)", url, timeout, p.log)
}

func runBusyPipelines(ctx context.Context, env *benchEnv, o options) (*busyResult, error) {
	const db = "bench_busy_pipelines"
	url, err := env.prepareDatabase(ctx, db)
	if err != nil {
		return nil, err
	}
	defer env.dropDatabase(db)
	n, reps := o.busyPipelines, o.busyReps
	slotsOf := func(mode string, rep int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s_%d_%d", map[string]string{modeOne: "one", modeSeparate: "sep"}[mode], rep, i))
		}
		return out
	}
	var all []string
	for r := 1; r <= reps; r++ {
		all = append(all, slotsOf(modeOne, r)...)
		all = append(all, slotsOf(modeSeparate, r)...)
	}
	if err := createSlots(ctx, url, all); err != nil {
		return nil, err
	}
	w := workload{Name: "busy-pipelines", Rows: o.busyRows, Payload: 1024, RowsPerTxn: 100}
	end, err := load(ctx, url, w)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	res := &busyResult{Pipelines: n, RowsEach: o.busyRows, Payload: w.Payload}
	fmt.Printf("   busy: %d rows of %d B loaded once; each pipeline drains them on its own slot\n", w.Rows, w.Payload)
	for r := 1; r <= reps; r++ {
		for _, mode := range []string{modeOne, modeSeparate} {
			waitQuiet(o.quietWait, runtime.NumCPU())
			run, err := busyRunOf(ctx, env, url, mode, r, slotsOf(mode, r), end, o.busyRows)
			if err != nil {
				return res, fmt.Errorf("%s, rep %d: %w", mode, r, err)
			}
			fmt.Printf("   %-18s rep %d: %6.1fs  %8.0f rows/s total  %6.1f CPU s  %6.0f MB peak RSS (summed)  others busy %.0f%%\n",
				mode, r, run.Seconds, run.RowsPerSec, run.CPUSeconds, run.PeakRSSMB, run.OthersBusy*100)
			res.Runs = append(res.Runs, run)
		}
	}
	res.RowsPerSecOne, res.RowsPerSecSeparate = medianRate(res.Runs, modeOne), medianRate(res.Runs, modeSeparate)
	if res.RowsPerSecSeparate > 0 {
		res.Ratio = res.RowsPerSecOne / res.RowsPerSecSeparate
	}
	fmt.Printf("   busy: one process %.0f rows/s, %d processes %.0f rows/s: ratio %.2f\n", res.RowsPerSecOne, n, res.RowsPerSecSeparate, res.Ratio)
	return res, nil
}

func medianRate(runs []busyRun, mode string) float64 {
	var rates []float64
	for _, r := range runs {
		if r.Mode == mode {
			rates = append(rates, r.RowsPerSec)
		}
	}
	if len(rates) == 0 {
		return 0
	}
	slices.Sort(rates)
	if len(rates)%2 == 0 {
		return (rates[len(rates)/2-1] + rates[len(rates)/2]) / 2
	}
	return rates[len(rates)/2]
}

// busyRunOf drains the backlog on every slot, by one process of all the
// pipelines or by one process per pipeline, into a broker of its own.
func busyRunOf(ctx context.Context, env *benchEnv, url, mode string, rep int, slots []string, end pglogrepl.LSN, rows int) (busyRun, error) {
	kb, err := newBenchKafka()
	if err != nil {
		return busyRun{}, err
	}
	defer kb.close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	busy0, self0 := machineBusy(), selfCPU()
	launched := time.Now()
	var procs []*relayProc
	defer func() {
		for _, p := range procs {
			_ = p.stop()
		}
	}()
	start := func(name, config, slot string) error {
		p, err := startRelay(env, name, config, slot)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		return nil
	}
	if mode == modeOne {
		listen, err := freeAddr()
		if err == nil {
			err = start(fmt.Sprintf("busy-one-%d", rep), pipelinesConfig(url, kb.addr, listen, slots), slots[0])
		}
		if err != nil {
			return busyRun{}, err
		}
	} else {
		for i, s := range slots {
			listen, err := freeAddr()
			if err == nil {
				err = start(fmt.Sprintf("busy-sep-%d-%d", rep, i), kafkaConfig(url, kb.addr, listen), s)
			}
			if err != nil {
				return busyRun{}, err
			}
		}
	}
	if err := waitConfirmed(ctx, url, slots, end, procs); err != nil {
		return busyRun{}, err
	}
	elapsed := time.Since(launched)
	var cpu time.Duration
	var rssKiB int64
	for _, p := range procs {
		s := readProc(p.cmd.Process.Pid)
		cpu += s.cpu
		rssKiB += s.hwmKiB
	}
	delivered, err := kb.rc.count(ctx)
	if err != nil {
		return busyRun{}, err
	}
	if want := int64(rows * len(slots)); delivered < want {
		return busyRun{}, fmt.Errorf("the broker holds %d records, want at least %d", delivered, want)
	}
	total := float64(rows * len(slots))
	return busyRun{
		Mode: mode, Rep: rep, Seconds: elapsed.Seconds(), RowsPerSec: total / elapsed.Seconds(),
		CPUSeconds: cpu.Seconds(), PeakRSSMB: float64(rssKiB) / 1024, Delivered: delivered,
		OthersBusy: othersShare(machineBusy()-busy0-(selfCPU()-self0), cpu, elapsed),
	}, nil
}

// waitConfirmed waits until every slot's confirmed_flush_lsn has passed
// end, polling every 50 ms, or a relay exits.
func waitConfirmed(ctx context.Context, url string, slots []string, end pglogrepl.LSN, procs []*relayProc) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var behind int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots
			WHERE slot_name = ANY($1) AND (confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < $2::pg_lsn)`, slots, end.String()).Scan(&behind)
		if err != nil {
			return fmt.Errorf("read the slots: %w", err)
		}
		if behind == 0 {
			return nil
		}
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("relay exited early: %v (log %s)", p.err, p.log)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d slots did not confirm the backlog: %w", behind, len(slots), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
