// Command outboxrelay-bench measures the relay against the physical
// ceiling of its two ends, on this machine, and writes the results as JSON
// so that runs can be compared.
//
// It starts a throwaway PostgreSQL (integration/pgserver), an in-process
// Kafka broker (kfake, reached over TCP) and uses RabbitMQ on
// 127.0.0.1:5672 when it answers. For each workload it creates one pgoutput
// slot per consumer, loads the backlog once and lets every consumer drain
// the same WAL:
//
//	pg_recvlogical   the decoding ceiling: walsender and a C client, output to /dev/null
//	pglogrepl        a bare Go loop that receives and discards
//	relay->kafka     the relay binary (a subprocess) into kfake
//	relay->kafka+schemas  the same with relay.schemas.dir set, every row
//	                 validated against a JSON Schema (1 KB, 100 rows/txn only):
//	                 its ratio to relay->kafka is the cost of validation
//	relay->kafka+routes  the same with 10 routing rules and a transform
//	                 (1 KB, 100 rows/txn only): every row is tried against
//	                 nine routes before the tenth takes it; its ratio to
//	                 relay->kafka is the cost of the rules
//	relay->kafka order:none  the same with relay.order: none (1kb-x100-hot
//	                 only): relay->kafka's ratio to it is what the
//	                 per-aggregate order costs a hot aggregate
//	pglogrepl->franz-go  the bare loop producing each insert's pgoutput message
//	                 to kfake with the sink's producer settings: the relay's
//	                 two libraries and nothing else
//	relay->rabbitmq  the same into RabbitMQ, a durable queue bound with "#"
//	amqp091          a bare publisher, 1,000 confirms outstanding, same count and size
//	pglogrepl->amqp091  the bare loop and that publisher on one goroutine, each
//	                 insert's pgoutput message as a body of that size: the
//	                 publisher with the WAL read on the same machine
//
// The latency run has two references of its own: the bare loop, and the
// bare loop producing each insert with franz-go (bareLatencyMain).
//
// A relay run is timed to the moment the broker holds every row, and also
// to the moment the slot's confirmed_flush_lsn passes the backlog, which
// adds the relay's checkpoint cadence. CPU seconds and peak RSS are those of
// the relay binary, read from /proc. The PostgreSQL-side consumers repeat,
// interleaved, and the table shows medians; every run is in the JSON.
//
// First it runs each webhook/cloud sink's BenchmarkSink against its
// BenchmarkBareClient (sinks.go), interleaved, and prints their ratio.
//
// Then it measures commit-to-consumer latency in a live run at a fixed rate
// with synchronous_commit on, and runs the Go micro-benchmarks of cdc and
// envelope (go test -bench).
//
// Usage (make bench runs it; make bench BENCHFLAGS=-quick for a short run):
//
//	go run ./cmd/outboxrelay-bench [-quick] [-rows N] [-bigtx-rows N] [-count N]
//	    [-profile WORKLOAD] [-relay-env KEY=VALUE,...] [-out FILE]
//	    [-sinks=false | -sinks-only] [-sink-count N] [-sink-benchtime 5000x]
//	    [-pipelines=false] [-idle-pipelines 50] [-idle-window 20s] [-busy-pipelines 10] [-busy-rows N] [-busy-count 2]
//
// The many-pipelines section (pipelines.go) starts a relay of 50 idle
// pipelines and one of a single pipeline, and reports the RSS and CPU per
// added idle pipeline; then it drains one backlog with 10 pipelines in one
// process and with 10 processes of one pipeline each, interleaved, each
// pipeline on a slot of its own, and reports the total rows/s and their ratio.
package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Consumer names, as the table shows them.
const (
	cRecvlogical = "pg_recvlogical"
	cPglogrepl   = "pglogrepl (bare)"
	cRelayKafka  = "relay->kafka"
	// cRelayKafkaSchemas validates every row against benchSchema.
	cRelayKafkaSchemas = "relay->kafka+schemas"
	// cRelayKafkaRoutes routes every row through benchRoutes.
	cRelayKafkaRoutes = "relay->kafka+routes"
	// cRelayKafkaNoOrder runs with relay.order: none, on the hot
	// aggregate workload: the reference that prices the ordering gate.
	cRelayKafkaNoOrder = "relay->kafka order:none"
	cRelayRabbit       = "relay->rabbitmq"
	cBareAMQP          = "amqp091 (bare)"
	// cBarePipeline reads the WAL with pglogrepl and publishes with
	// amqp091: the bare publisher plus a walsender's load.
	cBarePipeline = "pglogrepl->amqp091"
	// cBareKafka reads the WAL with pglogrepl and produces with franz-go
	// (barePipelineMain): the relay's two libraries and nothing else.
	cBareKafka = "pglogrepl->franz-go"
)

type options struct {
	rows, bigTxRows  int
	quick            bool
	only             string
	amqpURL          string
	out              string
	latencyRate      int
	latencyFor       time.Duration
	profile          string
	relayEnv         string
	micro            bool
	sinks, sinksOnly bool
	sinkCount        int
	sinkBenchtime    string
	skipRabbit       bool
	rabbitMaxRows    int
	count            int
	countMaxRows     int
	quietWait        time.Duration
	timeout          time.Duration
	// The many-pipelines section (pipelines.go).
	pipelines     bool
	idlePipelines int
	idleWindow    time.Duration
	busyPipelines int
	busyRows      int
	busyReps      int
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == bareLoopCommand {
		if err := bareLatencyMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, bareLoopCommand+":", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == barePipelineCommand {
		if err := barePipelineMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, barePipelineCommand+":", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.IntVar(&o.rows, "rows", 100_000, "rows per backlog workload (the 10 KB workload uses 3 in 10: three times the payload bytes, and runs long enough that the relay's start does not count)")
	flag.IntVar(&o.bigTxRows, "bigtx-rows", 1_000_000, "rows of the single-transaction workload")
	flag.BoolVar(&o.quick, "quick", false, "fewer rows (20,000; 200,000 in one transaction) and a 5 s latency run")
	flag.StringVar(&o.only, "only", "", "comma-separated workload names to run (default all)")
	flag.StringVar(&o.amqpURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ; unreachable means the RabbitMQ rows are skipped")
	flag.BoolVar(&o.skipRabbit, "skip-rabbitmq", false, "skip the RabbitMQ rows")
	flag.IntVar(&o.rabbitMaxRows, "rabbitmq-max-rows", 100_000, "skip the RabbitMQ rows of workloads with more rows (the single big transaction, by default), to stay within 10 minutes")
	flag.StringVar(&o.out, "out", "", "JSON results file (default .bench/results-<time>.json in the module)")
	flag.IntVar(&o.latencyRate, "latency-rate", 1000, "rows/s of the live latency run (0 skips it)")
	flag.DurationVar(&o.latencyFor, "latency-duration", 10*time.Second, "length of the live latency run")
	flag.StringVar(&o.profile, "profile", "", "comma-separated workloads whose relay->kafka also runs once, unmeasured, under perf record, and \"latency\" to record the relay of the latency run (which then counts perf's own cost); prints the top functions")
	flag.StringVar(&o.relayEnv, "relay-env", "", "comma-separated KEY=VALUE added to the relay's environment, and to the latency run's bare loop (GOGC=400, GOMAXPROCS=1, OUTBOXRELAY_SINK_KAFKA_LINGER=1ms, ...), for experiments")
	flag.DurationVar(&o.quietWait, "quiet-wait", 3*time.Second, "before each run, wait up to this long for the rest of the machine to use under 1/6 of its CPU")
	flag.IntVar(&o.count, "count", 5, "repetitions of the PostgreSQL-side consumers; the table shows the median")
	flag.IntVar(&o.countMaxRows, "count-max-rows", 200_000, "workloads with more rows run at most twice (the table then shows the faster run)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	flag.BoolVar(&o.micro, "micro", true, "run the cdc, envelope and outbox/schema micro-benchmarks (go test -bench)")
	flag.BoolVar(&o.sinks, "sinks", true, "run each cloud/webhook sink's BenchmarkSink against its BenchmarkBareClient and print their ratio")
	flag.BoolVar(&o.sinksOnly, "sinks-only", false, "run only the sink benchmarks (no PostgreSQL), writing the results file")
	flag.IntVar(&o.sinkCount, "sink-count", 3, "repetitions of the sink benchmarks, interleaved; the table shows medians")
	flag.StringVar(&o.sinkBenchtime, "sink-benchtime", "5000x", "-test.benchtime of each sink benchmark")
	flag.BoolVar(&o.pipelines, "pipelines", true, "run the many-pipelines section (-only pipelines runs it alone among the workloads)")
	flag.IntVar(&o.idlePipelines, "idle-pipelines", 50, "idle pipelines in one process, measured against a process of one")
	flag.DurationVar(&o.idleWindow, "idle-window", 20*time.Second, "how long the idle processes' CPU is measured")
	flag.IntVar(&o.busyPipelines, "busy-pipelines", 10, "busy pipelines in one process, against as many processes of one")
	flag.IntVar(&o.busyRows, "busy-rows", 20_000, "rows of 1 KB each busy pipeline drains (one backlog, a slot each)")
	flag.IntVar(&o.busyReps, "busy-count", 2, "repetitions of the busy pair, interleaved")
	flag.Parse()
	if o.quick {
		o.rows, o.bigTxRows, o.latencyFor = 20_000, 200_000, 5*time.Second
		o.busyRows, o.idleWindow = 5_000, 10*time.Second
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "outboxrelay-bench:", err)
		os.Exit(1)
	}
}

// benchEnv is what every measurement shares.
type benchEnv struct {
	root        string // module root
	workDir     string // relay configs and logs
	relayBin    string
	pg          *pgserver.Server
	publication string
	// relayExtraEnv is added to every relay's environment (-relay-env).
	relayExtraEnv []string
}

// results is the JSON file.
type results struct {
	Started    time.Time         `json:"started"`
	Seconds    float64           `json:"seconds"`
	Commit     string            `json:"commit"`
	Dirty      bool              `json:"dirty"`
	GoVersion  string            `json:"go_version"`
	PostgreSQL string            `json:"postgresql"`
	CPUs       int               `json:"cpus"`
	LoadAvg    float64           `json:"loadavg_1m_at_start"`
	Options    map[string]string `json:"options"`
	Workloads  []workloadResult  `json:"workloads"`
	Latency    *latencyResult    `json:"latency,omitempty"`
	Micro      []string          `json:"micro_benchmarks,omitempty"`
	Sinks      []sinkRow         `json:"sinks,omitempty"`
	Pipelines  *pipelinesResult  `json:"pipelines,omitempty"`
	Targets    []string          `json:"targets,omitempty"`
	Notes      []string          `json:"notes,omitempty"`
}

type workloadResult struct {
	workload
	LoadSeconds float64 `json:"load_seconds"`
	WALBytes    int64   `json:"wal_bytes"`
	// Summary has one row per consumer: the run with the median rate.
	Summary []measurement `json:"summary"`
	// Runs are all runs, in the order they ran (repetitions interleaved).
	Runs  []measurement `json:"runs"`
	Notes []string      `json:"notes,omitempty"`
}

// measurement is one consumer draining one workload's backlog.
type measurement struct {
	Consumer string `json:"consumer"`
	Rep      int    `json:"rep,omitempty"`
	// Seconds runs from the start of the walsender that served the
	// consumer to the consumer being done; StartupSeconds is the time
	// before it, from launching the consumer (the relay connects to
	// PostgreSQL and the broker first).
	Seconds        float64 `json:"seconds"`
	StartupSeconds float64 `json:"startup_seconds"`
	// AllocKBPerRow and GCs come from the relay's /metrics at the end of
	// the run (go_memstats_alloc_bytes_total, go_gc_duration_seconds_count).
	AllocKBPerRow float64 `json:"relay_alloc_kb_per_row,omitempty"`
	GCs           int     `json:"relay_gcs,omitempty"`
	// ConfirmLagSeconds is, for the relay, the time from the broker holding
	// every row to the slot's confirmed_flush_lsn passing the backlog.
	ConfirmLagSeconds float64 `json:"confirm_lag_seconds,omitempty"`
	RowsPerSec        float64 `json:"rows_per_sec"`
	MBPerSec          float64 `json:"payload_mb_per_sec"`
	// Min and max of RowsPerSec over the repetitions (summary rows only).
	RowsPerSecMin float64 `json:"rows_per_sec_min,omitempty"`
	RowsPerSecMax float64 `json:"rows_per_sec_max,omitempty"`
	Reps          int     `json:"reps,omitempty"`
	// CPUPer100k is the consumer process's CPU seconds per 100,000 rows;
	// for the bare Go consumers it is this process's.
	CPUPer100k float64 `json:"cpu_s_per_100k"`
	// WalsenderCPUPer100k is the CPU of the PostgreSQL walsender that
	// decoded for the consumer.
	WalsenderCPUPer100k float64 `json:"walsender_cpu_s_per_100k,omitempty"`
	// BrokerCPUPer100k is the broker's CPU: for relay->kafka this
	// process's (kfake), for the RabbitMQ rows the RabbitMQ server's.
	BrokerCPUPer100k float64 `json:"broker_cpu_s_per_100k,omitempty"`
	// OthersBusy is the share of the machine's CPU used by everything else
	// (PostgreSQL's other processes, RabbitMQ, other users) during the run.
	OthersBusy float64 `json:"others_busy_share"`
	PeakRSSMB  float64 `json:"peak_rss_mb,omitempty"`
	Ratio      float64 `json:"ratio,omitempty"`
	RatioOf    string  `json:"ratio_of,omitempty"`
	Delivered  int64   `json:"delivered,omitempty"`
	// Miscounted is set when the broker held another number of records
	// than the backlog's rows: the run timed something else, and is left
	// out of the summary and of every ratio.
	Miscounted bool   `json:"miscounted,omitempty"`
	Note       string `json:"note,omitempty"`

	launched, streamed, done, confirmed              time.Time
	consumerCPU, walsenderCPU, benchCPU, machineBusy time.Duration
	brokerCPU                                        time.Duration // RabbitMQ
	allocBytes                                       float64
	inProcess                                        bool
}

func run(ctx context.Context, o options) error {
	res := &results{Started: time.Now(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), LoadAvg: loadAvg()}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	res.Commit, res.Dirty = gitState(root)
	res.Options = map[string]string{
		"rows": fmt.Sprint(o.rows), "bigtx_rows": fmt.Sprint(o.bigTxRows), "quick": fmt.Sprint(o.quick),
		"latency_rate": fmt.Sprint(o.latencyRate), "latency_duration": o.latencyFor.String(),
		"count": fmt.Sprint(o.count), "relay_env": o.relayEnv,
		"sink_count": fmt.Sprint(o.sinkCount), "sink_benchtime": o.sinkBenchtime,
		"idle_pipelines": fmt.Sprint(o.idlePipelines), "idle_window": o.idleWindow.String(),
		"busy_pipelines": fmt.Sprint(o.busyPipelines), "busy_rows": fmt.Sprint(o.busyRows), "busy_count": fmt.Sprint(o.busyReps),
	}
	if o.sinks || o.sinksOnly {
		res.Sinks = sinkBenchmarks(ctx, root, o.sinkCount, o.sinkBenchtime)
	}
	if o.sinksOnly {
		res.Seconds = time.Since(res.Started).Seconds()
		printSinkRows(os.Stdout, res.Sinks)
		return writeResults(root, o.out, "-sinks", res)
	}

	if o.micro {
		fmt.Println("== micro-benchmarks: go test -run='^$' -bench=. -benchmem ./cdc ./envelope github.com/outboxrelay/outboxrelay/outbox/schema")
		lines, err := microBenchmarks(ctx, root)
		res.Micro = lines
		if err != nil {
			res.Notes = append(res.Notes, "micro-benchmarks failed: "+err.Error())
			fmt.Fprintln(os.Stderr, "micro-benchmarks:", err)
		}
	}

	workDir, err := os.MkdirTemp("", "outboxrelay-bench-")
	if err != nil {
		return err
	}
	env := &benchEnv{root: root, workDir: workDir, publication: "outboxrelay", relayBin: filepath.Join(workDir, "outboxrelay")}
	for kv := range strings.SplitSeq(o.relayEnv, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			env.relayExtraEnv = append(env.relayExtraEnv, kv)
		}
	}
	fmt.Println("== building the relay")
	build := exec.CommandContext(ctx, "go", "build", "-o", env.relayBin, "./cmd/outboxrelay")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build relay: %w", err)
	}

	fmt.Println("== starting PostgreSQL")
	env.pg, err = pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{
		"max_wal_size":          "16GB",
		"checkpoint_timeout":    "1h",
		"shared_buffers":        "512MB",
		"wal_buffers":           "64MB",
		"max_wal_senders":       "64",
		"max_replication_slots": "64",
		// 50 pipelines in one process hold a pool and a stream each.
		"max_connections": "400",
		// The tables are insert-only; autovacuum would only add noise.
		"autovacuum": "off",
	}})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	defer env.pg.Stop()
	res.PostgreSQL = serverVersion(ctx, env.pg.URL("postgres"))

	var rb *rabbit
	if !o.skipRabbit {
		rb, err = openRabbit(o.amqpURL, fmt.Sprintf("outboxrelay-bench-%d", os.Getpid()))
		if err != nil {
			note := fmt.Sprintf("RabbitMQ rows skipped: %s is unreachable (%v)", redact.URL(o.amqpURL), err)
			res.Notes = append(res.Notes, note)
			fmt.Println("!!", note)
			rb = nil
		} else {
			defer rb.close()
		}
	}

	for _, w := range workloads(o) {
		if o.only != "" && !slices.Contains(strings.Split(o.only, ","), w.Name) {
			continue
		}
		wr, err := runWorkload(ctx, env, w, o, rb, slices.Contains(strings.Split(o.profile, ","), w.Name))
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			note := fmt.Sprintf("workload %s failed: %v", w.Name, err)
			fmt.Println("!!", note)
			res.Notes = append(res.Notes, note)
		}
		if wr != nil {
			res.Workloads = append(res.Workloads, *wr)
		}
	}

	if o.pipelines && (o.only == "" || slices.Contains(strings.Split(o.only, ","), "pipelines")) {
		res.Pipelines = runPipelines(ctx, env, o)
	}

	if o.latencyRate > 0 {
		waitQuiet(o.quietWait, runtime.NumCPU())
		fmt.Printf("== latency: %d rows/s for %s, synchronous_commit=on, into kfake\n", o.latencyRate, o.latencyFor)
		lat, err := runLatency(ctx, env, o.latencyRate, o.latencyFor, slices.Contains(strings.Split(o.profile, ","), "latency"))
		if err != nil {
			res.Notes = append(res.Notes, "latency run: "+err.Error())
			fmt.Fprintln(os.Stderr, "latency run:", err)
		}
		res.Latency = lat
	}
	res.Seconds = time.Since(res.Started).Seconds()
	res.Targets = targets(res)

	printReport(os.Stdout, res)
	if err := writeResults(root, o.out, "", res); err != nil {
		return err
	}
	_ = os.RemoveAll(workDir)
	return nil
}

// writeResults writes res to path, by default
// .bench/results-<time><suffix>.json in the module.
func writeResults(root, path, suffix string, res *results) error {
	if path == "" {
		path = filepath.Join(root, ".bench", "results-"+res.Started.Format("20060102-150405")+suffix+".json")
	}
	if err := writeJSON(path, res); err != nil {
		return err
	}
	fmt.Println("results written to", path)
	return nil
}

func workloads(o options) []workload {
	return []workload{
		{Name: "1kb-x100", Rows: o.rows, Payload: 1024, RowsPerTxn: 100, Headline: true},
		// The aggregate dimension: few active aggregates, and one.
		{Name: "1kb-x100-64agg", Rows: max(o.rows/2, 1), Payload: 1024, RowsPerTxn: 100, Aggregates: 64},
		// One broker round trip per row: a tenth of the rows keeps it under a minute.
		{Name: "1kb-x100-hot", Rows: max(o.rows/10, 1), Payload: 1024, RowsPerTxn: 100, HotAggregate: true},
		{Name: "1kb-x1", Rows: o.rows, Payload: 1024, RowsPerTxn: 1},
		{Name: "200b-x100", Rows: o.rows, Payload: 200, RowsPerTxn: 100},
		{Name: "10kb-toast-x10", Rows: max(o.rows*3/10, 1), Payload: 10 * 1024, RowsPerTxn: 10, Toast: true},
		{Name: "200b-1tx", Rows: o.bigTxRows, Payload: 200, RowsPerTxn: o.bigTxRows},
	}
}

// runWorkload loads one backlog and lets every consumer drain it. The
// PostgreSQL-side consumers run reps times, interleaved, each on its own
// slot, so that a burst of load from elsewhere on the machine hits one
// repetition rather than one consumer.
func runWorkload(ctx context.Context, env *benchEnv, w workload, o options, rb *rabbit, profile bool) (*workloadResult, error) {
	db := "bench_" + strings.NewReplacer("-", "_").Replace(w.Name)
	reps := o.count
	if w.Rows > o.countMaxRows {
		reps = min(reps, 2)
	}
	fmt.Printf("== %s: %d rows of %d B, %d rows/txn%s; %d repetition(s)\n", w.Name, w.Rows, w.Payload, w.RowsPerTxn,
		map[bool]string{true: ", payload TOASTed", false: ""}[w.Toast], reps)
	url, err := env.prepareDatabase(ctx, db)
	if err != nil {
		return nil, err
	}
	defer env.dropDatabase(db)

	withRabbit := rb != nil && w.Rows <= o.rabbitMaxRows
	var variants []kafkaVariant
	for _, v := range kafkaVariants {
		if v.applies(w) {
			variants = append(variants, v)
		}
	}
	var slots []string
	for r := 1; r <= reps; r++ {
		slots = append(slots, slotName("recvlogical", r), slotName("pglogrepl", r), slotName("relay_kafka", r), slotName("bare_kafka", r))
		for _, v := range variants {
			slots = append(slots, slotName(v.slot, r))
		}
	}
	// The RabbitMQ triple (relay, bare publisher, pipeline) repeats too, interleaved;
	// a spare slot repeats one relay run after a broker restart.
	rabbitReps := min(reps, 3)
	if withRabbit {
		for r := 1; r <= rabbitReps; r++ {
			slots = append(slots, slotName("relay_rabbitmq", r), slotName("bare_pipeline", r))
		}
		slots = append(slots, "relay_rabbitmq_spare")
	}
	if profile {
		slots = append(slots, "relay_kafka_profile")
		if withRabbit {
			slots = append(slots, "relay_rabbitmq_profile")
		}
	}
	if err := createSlots(ctx, url, slots); err != nil {
		return nil, err
	}
	start0, err := currentLSN(ctx, url)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	end, err := load(ctx, url, w)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	wr := &workloadResult{workload: w, LoadSeconds: time.Since(t0).Seconds(), WALBytes: int64(end - start0)}
	fmt.Printf("   loaded in %.1fs, %.0f MB of WAL\n", wr.LoadSeconds, float64(wr.WALBytes)/1e6)

	// add records a run and returns its index; a consumer that fails is
	// reported and the others still run.
	add := func(m measurement, err error, name string, rep int) int {
		if err != nil {
			fmt.Printf("   %-18s FAILED: %v\n", name, err)
			wr.Runs = append(wr.Runs, measurement{Consumer: name, Rep: rep, Note: "FAILED: " + err.Error()})
			return -1
		}
		m.Consumer, m.Rep = name, rep
		m.finish(w)
		fmt.Printf("   %-18s %6.2fs (start %.2fs, confirm +%.2fs) %8.0f rows/s  cpu %.2f  walsender %.2f  broker %.2f s/100k  rss %3.0f MB  others %2.0f%%%s\n",
			name, m.Seconds, m.StartupSeconds, m.ConfirmLagSeconds, m.RowsPerSec, m.CPUPer100k, m.WalsenderCPUPer100k, m.BrokerCPUPer100k, m.PeakRSSMB, 100*m.OthersBusy, m.gcNote())
		wr.Runs = append(wr.Runs, m)
		return len(wr.Runs) - 1
	}

	quiet := func() { waitQuiet(o.quietWait, runtime.NumCPU()) }
	for r := 1; r <= reps; r++ {
		quiet()
		m, err := runRecvlogical(ctx, env, db, slotName("recvlogical", r), end)
		add(m, err, cRecvlogical, r)
		quiet()
		m, err = runBareReplication(ctx, env, db, slotName("pglogrepl", r), end)
		add(m, err, cPglogrepl, r)
		quiet()
		m, err = runRelayKafka(ctx, env, w, url, db, slotName("relay_kafka", r), end, "")
		if i := add(m, err, cRelayKafka, r); i >= 0 {
			wr.Runs[i].checkDelivered(w.Rows)
		}
		quiet()
		m, err = runBareKafkaPipeline(ctx, env, w, db, slotName("bare_kafka", r), end)
		if i := add(m, err, cBareKafka, r); i >= 0 {
			wr.Runs[i].checkDelivered(w.Rows)
		}
		for _, v := range variants {
			quiet()
			m, err = runRelayKafkaVariant(ctx, env, w, url, db, slotName(v.slot, r), end, v)
			if i := add(m, err, v.consumer, r); i >= 0 {
				// A row the feature refused or misrouted would be missing here.
				wr.Runs[i].checkDelivered(w.Rows)
			}
		}
	}

	if profile {
		if err := profileRelay(ctx, env, w, url, db, end); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		}
	}

	switch {
	case rb == nil:
	case !withRabbit:
		wr.Notes = append(wr.Notes, fmt.Sprintf("RabbitMQ rows skipped: %d rows is over -rabbitmq-max-rows %d", w.Rows, o.rabbitMaxRows))
	default:
		// RabbitMQ on this machine is shared: when it is restarted under
		// a run, the run is repeated once (on the spare slot) after the
		// broker answers again.
		spare := "relay_rabbitmq_spare"
		body := 0
		for r := 1; r <= rabbitReps; r++ {
			slot := slotName("relay_rabbitmq", r)
			for {
				quiet()
				m, n, err := runRelayRabbit(ctx, env, w, rb, url, db, slot, end, "")
				if err != nil && spare != "" && rb.waitUp(ctx, time.Minute) {
					fmt.Printf("   %-18s failed (%v); RabbitMQ answers again, repeating\n", cRelayRabbit, err)
					slot, spare = spare, ""
					continue
				}
				if n > 0 {
					body = n
				}
				if i := add(m, err, cRelayRabbit, r); i >= 0 {
					wr.Runs[i].checkDelivered(w.Rows)
				}
				break
			}
			if body == 0 {
				body = w.Payload + 512 // about an envelope's overhead
			}
			for attempt := 1; attempt <= 2; attempt++ {
				quiet()
				m, err := runBareAMQP(ctx, rb, w.Rows, body)
				if err != nil && attempt == 1 && rb.waitUp(ctx, time.Minute) {
					fmt.Printf("   %-18s failed (%v); RabbitMQ answers again, repeating\n", cBareAMQP, err)
					continue
				}
				if i := add(m, err, cBareAMQP, r); i >= 0 {
					wr.Runs[i].checkDelivered(w.Rows)
				}
				break
			}
			quiet()
			m, err := runBarePipeline(ctx, env, rb, db, slotName("bare_pipeline", r), end, w.Rows, body)
			if i := add(m, err, cBarePipeline, r); i >= 0 {
				wr.Runs[i].checkDelivered(w.Rows)
			}
		}
		if profile {
			if err := profileRelayRabbit(ctx, env, w, rb, url, db, end); err != nil {
				fmt.Fprintln(os.Stderr, "profile:", err)
			}
		}
	}
	wr.summarize()
	return wr, nil
}

// runRelayRabbit runs the relay into the benchmark's queue and returns the
// size of the envelopes it published.
func runRelayRabbit(ctx context.Context, env *benchEnv, w workload, rb *rabbit, url, db, slot string, end pglogrepl.LSN, profile string) (measurement, int, error) {
	if err := rb.purge(); err != nil {
		return measurement{}, 0, err
	}
	defer rb.purge() // the next run purges first too
	qd, err := rb.depth()
	if err != nil {
		return measurement{}, 0, err
	}
	b0 := rb.serverCPU()
	m, err := runRelay(ctx, env, "relay-rabbitmq-"+w.Name, func(listen string) string { return rabbitConfig(url, rb.url, listen) }, db, slot, end, w.Rows, qd.count, 50*time.Millisecond, profile)
	m.brokerCPU = rb.serverCPU() - b0
	qd.close()
	if err != nil {
		return m, 0, err
	}
	n, body, err := rb.settle(ctx, w.Rows)
	m.Delivered = int64(n)
	return m, body, err
}

// runBareAMQP publishes rows messages of body bytes with the bare publisher.
func runBareAMQP(ctx context.Context, rb *rabbit, rows, body int) (measurement, error) {
	if err := rb.purge(); err != nil {
		return measurement{}, err
	}
	defer rb.purge() // the next run purges first too
	busy0, cpu0, b0 := machineBusy(), selfCPU(), rb.serverCPU()
	m := measurement{launched: time.Now(), inProcess: true, Note: fmt.Sprintf("%d B bodies, the size of the relay's envelopes", body)}
	err := bareAMQP(ctx, rb.url, rows, fixedBody(body))
	m.done, m.consumerCPU, m.machineBusy, m.brokerCPU = time.Now(), selfCPU()-cpu0, machineBusy()-busy0, rb.serverCPU()-b0
	if err != nil {
		return m, err
	}
	n, _, err := rb.settle(ctx, rows)
	m.Delivered = int64(n)
	return m, err
}

// benchSchema is the JSON Schema of the benchmark's rows
// ({"seq": N, "data": "<hex>"}): what a typical event schema checks, a
// required integer with a bound and a bounded string.
const benchSchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
 "required": ["seq", "data"],
 "properties": {"seq": {"type": "integer", "minimum": 1}, "data": {"type": "string", "maxLength": 65536}}}`

// schemasConfig writes benchSchema into the work folder and returns the
// configuration that validates every row against it; missing: deadletter,
// so a row that escaped validation would be missing from the broker.
func schemasConfig(env *benchEnv) (string, error) {
	dir := filepath.Join(env.workDir, "schemas")
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "order.created", "v1.json"), []byte(benchSchema), 0o644); err != nil {
		return "", err
	}
	return fmt.Sprintf("relay:\n  schemas:\n    dir: %s\n    missing: deadletter\n", dir), nil
}

// benchRoutes are ten routes and a transform as a service's outbox might
// have them: conditions on the aggregate type, the event type, the headers
// and payload fields, in the order a team would write them, specific ones
// first. The benchmark's rows (aggregate_type order, event_type
// order.created, no headers, payload {"seq": N, "data": ...}) fail the
// first nine, each for a reason of its own, and the tenth takes them to
// the topic the record counter reads; unmatched: deadletter, so a row the
// rules lost would be missing from the broker. The transform sets the key
// and a header from a payload field.
//
// They are in routes.yaml, which relay's BenchmarkBuildRoutes reads too.
//
//go:embed routes.yaml
var benchRoutes string

// kafkaVariant is relay->kafka with one feature turned on: measured on a
// slot of its own, interleaved with the plain relay->kafka repetitions, so
// that the ratio of each pair is the feature's cost under the same load.
type kafkaVariant struct {
	consumer string
	slot     string
	applies  func(workload) bool
	// config returns the YAML appended to the relay's configuration.
	config func(env *benchEnv) (string, error)
	// what names the feature in targets; empty when the variant has a
	// target of its own there.
	what string
}

// oneKBx100 is where the features' costs are measured, where the issues
// set their budgets: 1 KB rows, 100 a transaction, over 1,000 aggregates.
func oneKBx100(w workload) bool {
	return w.Payload == 1024 && w.RowsPerTxn == 100 && w.aggregates() == 1000
}

func fixedConfig(yaml string) func(*benchEnv) (string, error) {
	return func(*benchEnv) (string, error) { return yaml, nil }
}

var kafkaVariants = []kafkaVariant{
	{consumer: cRelayKafkaSchemas, slot: "relay_kafka_schemas", applies: oneKBx100, config: schemasConfig, what: "schema validation"},
	{consumer: cRelayKafkaRoutes, slot: "relay_kafka_routes", applies: oneKBx100, config: fixedConfig(benchRoutes), what: "10 routes and a transform"},
	// The reference that prices the ordering gate on the hot aggregate:
	// relay->kafka's ratio to it (targets).
	{consumer: cRelayKafkaNoOrder, slot: "relay_kafka_none", applies: func(w workload) bool { return w.HotAggregate },
		config: fixedConfig("relay:\n  order: none\n  dead_letter_order: pass\n")},
}

// isKafkaVariant reports whether consumer is one of kafkaVariants.
func isKafkaVariant(consumer string) bool {
	return slices.ContainsFunc(kafkaVariants, func(v kafkaVariant) bool { return v.consumer == consumer })
}

// runRelayKafkaVariant is runRelayKafka with v's configuration.
func runRelayKafkaVariant(ctx context.Context, env *benchEnv, w workload, url, db, slot string, end pglogrepl.LSN, v kafkaVariant) (measurement, error) {
	extra, err := v.config(env)
	if err != nil {
		return measurement{}, err
	}
	return runRelayKafkaWith(ctx, env, w, url, db, slot, end, "", extra)
}

// runRelayKafka runs the relay into a fresh kfake broker.
func runRelayKafka(ctx context.Context, env *benchEnv, w workload, url, db, slot string, end pglogrepl.LSN, profile string) (measurement, error) {
	return runRelayKafkaWith(ctx, env, w, url, db, slot, end, profile, "")
}

// runRelayKafkaWith is runRelayKafka with extra YAML appended to the relay's configuration.
func runRelayKafkaWith(ctx context.Context, env *benchEnv, w workload, url, db, slot string, end pglogrepl.LSN, profile, extra string) (measurement, error) {
	kb, err := newBenchKafka()
	if err != nil {
		return measurement{}, err
	}
	defer kb.close()
	m, err := runRelay(ctx, env, "relay-kafka-"+w.Name, func(listen string) string { return kafkaConfig(url, kb.addr, listen) + extra }, db, slot, end, w.Rows, kb.rc.count, 10*time.Millisecond, profile)
	if err != nil {
		return m, err
	}
	m.Delivered, err = kb.rc.count(ctx)
	return m, err
}

func slotName(consumer string, rep int) string { return fmt.Sprintf("%s_%d", consumer, rep) }

// summarize picks each consumer's median run (of two, the faster) and
// computes the ratios between medians.
func (wr *workloadResult) summarize() {
	var order []string
	byConsumer := map[string][]measurement{}
	for _, m := range wr.Runs {
		if _, ok := byConsumer[m.Consumer]; !ok {
			order = append(order, m.Consumer)
		}
		byConsumer[m.Consumer] = append(byConsumer[m.Consumer], m)
	}
	rate := map[string]float64{}
	for _, c := range order {
		runs := byConsumer[c]
		var ok []measurement
		for _, m := range runs {
			if m.timed() {
				ok = append(ok, m)
			}
		}
		if len(ok) == 0 {
			wr.Summary = append(wr.Summary, runs[0])
			continue
		}
		slices.SortFunc(ok, func(a, b measurement) int { return cmpFloat(a.RowsPerSec, b.RowsPerSec) })
		med := ok[len(ok)/2]
		med.Rep, med.Reps = 0, len(ok)
		med.RowsPerSecMin, med.RowsPerSecMax = ok[0].RowsPerSec, ok[len(ok)-1].RowsPerSec
		rate[c] = med.RowsPerSec
		wr.Summary = append(wr.Summary, med)
	}
	for i := range wr.Summary {
		m := &wr.Summary[i]
		ref := ""
		switch m.Consumer {
		case cPglogrepl, cRelayKafka, cBareKafka:
			ref = cRecvlogical
		case cRelayRabbit, cBarePipeline:
			ref = cBareAMQP
		}
		if isKafkaVariant(m.Consumer) {
			ref = cRelayKafka
		}
		if ref != "" && rate[ref] > 0 && m.RowsPerSec > 0 {
			m.Ratio, m.RatioOf = m.RowsPerSec/rate[ref], ref
		}
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// finish derives the rates from the raw measurement.
func (m *measurement) finish(w workload) {
	start := m.streamed
	if start.IsZero() || start.Before(m.launched) {
		start = m.launched // no walsender (RabbitMQ), or too short to be seen
	}
	m.Seconds = m.done.Sub(start).Seconds()
	m.StartupSeconds = start.Sub(m.launched).Seconds()
	last := m.done
	if !m.confirmed.IsZero() {
		m.ConfirmLagSeconds = m.confirmed.Sub(m.done).Seconds()
		last = m.confirmed
	}
	rows := float64(w.Rows)
	m.AllocKBPerRow = m.allocBytes / rows / 1024
	m.RowsPerSec = rows / m.Seconds
	m.MBPerSec = w.payloadBytes() / 1e6 / m.Seconds
	per := func(d time.Duration) float64 { return d.Seconds() / rows * 100_000 }
	m.CPUPer100k = per(m.consumerCPU)
	m.WalsenderCPUPer100k = per(m.walsenderCPU)
	switch c := m.Consumer; {
	case c == cRelayKafka || c == cBareKafka || isKafkaVariant(c):
		m.BrokerCPUPer100k = per(m.benchCPU)
	case c == cRelayRabbit || c == cBareAMQP || c == cBarePipeline:
		m.brokerCPU = max(m.brokerCPU, 0) // negative if the broker restarted
		m.BrokerCPUPer100k = per(m.brokerCPU)
	}
	others := m.machineBusy - m.consumerCPU - m.walsenderCPU - m.benchCPU - m.brokerCPU
	wall := last.Sub(m.launched).Seconds()
	m.OthersBusy = max(others.Seconds(), 0) / (wall * float64(runtime.NumCPU()))
}

func (m *measurement) gcNote() string {
	if m.GCs == 0 {
		return ""
	}
	return fmt.Sprintf("  alloc %.1f KB/row, %d GCs", m.AllocKBPerRow, m.GCs)
}

// timed reports whether m measured draining the backlog: it took time, and
// the broker held exactly the backlog's rows where that is counted.
func (m *measurement) timed() bool { return m.Seconds > 0 && !m.Miscounted }

func (m *measurement) checkDelivered(want int) {
	m.Miscounted = m.Delivered != int64(want)
	switch {
	case m.Delivered < int64(want):
		m.Note = strings.TrimSpace(fmt.Sprintf("%s ONLY %d of %d rows delivered", m.Note, m.Delivered, want))
	case m.Delivered > int64(want):
		m.Note = strings.TrimSpace(fmt.Sprintf("%s %d records for %d rows (duplicates or other publishers)", m.Note, m.Delivered, want))
	}
}

// profileRelay runs relay->kafka once more, unmeasured, under perf record,
// and prints the functions that took the most CPU.
func profileRelay(ctx context.Context, env *benchEnv, w workload, url, db string, end pglogrepl.LSN) error {
	data, err := profilePath(env, "relay-kafka-"+w.Name, "an extra, unmeasured run under perf record")
	if err != nil {
		return err
	}
	if _, err := runRelayKafka(ctx, env, w, url, db, "relay_kafka_profile", end, data); err != nil {
		return err
	}
	return perfReport(ctx, data)
}

// profileRelayRabbit does the same for relay->rabbitmq.
func profileRelayRabbit(ctx context.Context, env *benchEnv, w workload, rb *rabbit, url, db string, end pglogrepl.LSN) error {
	data, err := profilePath(env, "relay-rabbitmq-"+w.Name, "an extra, unmeasured run under perf record")
	if err != nil {
		return err
	}
	if _, _, err := runRelayRabbit(ctx, env, w, rb, url, db, "relay_rabbitmq_profile", end, data); err != nil {
		return err
	}
	return perfReport(ctx, data)
}

func profilePath(env *benchEnv, name, note string) (string, error) {
	dir := filepath.Join(env.root, ".bench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	fmt.Printf("   profiling %s (%s)\n", name, note)
	return filepath.Join(dir, "perf-"+name+".data"), nil
}

// perfReport prints the top functions of a perf recording, by self time and
// by time including callees, and keeps both reports beside it.
func perfReport(ctx context.Context, data string) error {
	for _, mode := range []string{"--no-children", "--children"} {
		out, err := exec.CommandContext(ctx, "perf", "report", "-i", data, "--stdio", mode, "-g", "none",
			"--percent-limit", "1", "--sort", "symbol").Output()
		if err != nil {
			return fmt.Errorf("perf report: %w", err)
		}
		txt := strings.TrimSuffix(data, ".data") + map[string]string{"--no-children": ".self.txt", "--children": ".total.txt"}[mode]
		if err := os.WriteFile(txt, out, 0o644); err != nil {
			return err
		}
		fmt.Printf("   top functions (%s), full report in %s:\n", map[string]string{"--no-children": "self", "--children": "including callees"}[mode], txt)
		n := 0
		for line := range strings.SplitSeq(string(out), "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			fmt.Println("     ", strings.TrimRight(strings.TrimSuffix(strings.TrimRight(line, " "), "-      -"), " "))
			if n++; n == 25 {
				break
			}
		}
	}
	return nil
}

// prepareDatabase creates db and migrates it with the relay binary.
func (e *benchEnv) prepareDatabase(ctx context.Context, db string) (string, error) {
	url, err := e.pg.CreateDatabase(ctx, db)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, e.relayBin, "migrate", "--database-url", url)
	cmd.Env = relayEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("outboxrelay migrate: %w: %s", err, out)
	}
	return url, nil
}

func (e *benchEnv) dropDatabase(db string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dropDatabase(ctx, e.pg.URL("postgres"), db); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
	}
}

func currentLSN(ctx context.Context, url string) (pglogrepl.LSN, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

func serverVersion(ctx context.Context, url string) string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.PgConn().ParameterStatus("server_version")
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run outboxrelay-bench inside the outboxrelay module (make bench)")
	}
	return filepath.Dir(mod), nil
}

func gitState(root string) (commit string, dirty bool) {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "", false
	}
	st, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), len(st) > 0
}

// microBenchmarks runs the Go benchmarks, streaming their output, and
// returns the result lines.
func microBenchmarks(ctx context.Context, root string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run=^$", "-bench=.", "-benchmem", "./cdc", "./envelope", "github.com/outboxrelay/outboxrelay/outbox/schema")
	cmd.Dir, cmd.Stderr = root, os.Stderr
	pr, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var lines []string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		fmt.Println(line)
		if strings.HasPrefix(line, "Benchmark") {
			lines = append(lines, strings.Join(strings.Fields(line), " "))
		}
	}
	return lines, cmd.Wait()
}

func writeJSON(path string, res *results) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// targets checks the measurements against the targets of the performance
// issue, each figure beside the reference measured in the same run.
func targets(res *results) []string {
	var out []string
	check := func(ok bool, format string, args ...any) {
		mark := "MISSED"
		if ok {
			mark = "met   "
		}
		out = append(out, mark+" "+fmt.Sprintf(format, args...))
	}
	info := func(format string, args ...any) { out = append(out, "info   "+fmt.Sprintf(format, args...)) }
	peak, peakAt := 0.0, ""
	for _, w := range res.Workloads {
		for _, m := range w.Runs {
			if (m.Consumer == cRelayKafka || m.Consumer == cRelayRabbit) && m.PeakRSSMB > peak {
				peak, peakAt = m.PeakRSSMB, w.Name+" "+m.Consumer
			}
		}
	}
	// Into Kafka: the decoding ceiling, at 1 KB rows and at 10 KB rows.
	for _, t := range []struct {
		workload string
		goal     float64
	}{{"1kb-x100", 0.8}, {"10kb-toast-x10", 0.95}} {
		if m, ref := summaryOf(res, t.workload, cRelayKafka), summaryOf(res, t.workload, cRecvlogical); m != nil && ref != nil && m.RatioOf != "" {
			bare := ""
			if b := summaryOf(res, t.workload, cBareKafka); b != nil && b.RowsPerSec > 0 && b.CPUPer100k > 0 {
				bare = fmt.Sprintf("; the bare pipeline (pglogrepl->franz-go) %.2f, the relay x%.2f of its rows/s and x%.2f of its CPU per row",
					b.Ratio, m.RowsPerSec/b.RowsPerSec, m.CPUPer100k/b.CPUPer100k)
			}
			check(m.Ratio >= t.goal, "relay->kafka at %s: %.0f rows/s, %.2f of pg_recvlogical's %.0f (medians%s; target >= %.2f)",
				t.workload, m.RowsPerSec, m.Ratio, ref.RowsPerSec, bare, t.goal)
		}
	}
	// Into RabbitMQ: the best safe bare publisher, at 1 KB and at 10 KB.
	for _, name := range []string{"1kb-x100", "10kb-toast-x10"} {
		w := workloadOf(res, name)
		if w == nil {
			continue
		}
		rate, cpu, n := pairedRatios(w.Runs, cRelayRabbit, cBareAMQP, 1)
		if n == 0 {
			continue
		}
		m, ref := summaryOf(res, name, cRelayRabbit), summaryOf(res, name, cBareAMQP)
		// The pipeline reads the WAL too: what the bare publisher reaches
		// with a walsender on the same machine, and the relay against it.
		pipeline := ""
		if pr, _, pn := pairedRatios(w.Runs, cBarePipeline, cBareAMQP, 1); pn > 0 {
			rr, rc, _ := pairedRatios(w.Runs, cRelayRabbit, cBarePipeline, 1)
			pipeline = fmt.Sprintf("; the bare pipeline (pglogrepl->amqp091) x%.2f of the publisher, the relay x%.2f of the pipeline (CPU per row x%.2f)", pr, rr, rc)
		}
		check(rate >= 0.9, "relay->rabbitmq at %s: %.0f rows/s against the bare amqp091 publisher's %.0f (medians); median of %d interleaved pairs x%.2f, relay CPU per row / the bare publisher's x%.2f%s (target >= 0.90)",
			name, m.RowsPerSec, ref.RowsPerSec, n, rate, cpu, pipeline)
	}
	// The cost of a feature: the variant against relay->kafka, pair by pair.
	for _, v := range kafkaVariants {
		w := workloadOf(res, "1kb-x100")
		if v.what == "" || w == nil || summaryOf(res, w.Name, v.consumer) == nil {
			continue
		}
		rate, cpu, n := pairedRatios(w.Runs, v.consumer, cRelayKafka, quietPair)
		if n == 0 {
			rate, cpu, n = pairedRatios(w.Runs, v.consumer, cRelayKafka, math.Inf(1))
			out = append(out, fmt.Sprintf("n/a    %s at %s: no repetition ran with the rest of the machine under %.0f%% busy; run again on a quieter machine (median of all %d pairs, noisy: rows/s x%.2f, relay CPU per row x%.2f)",
				v.what, w.Name, 100*quietPair, n, rate, cpu))
		} else {
			check(rate >= 0.9, "%s at %s: %s / relay->kafka, median of %d quiet interleaved pairs (others busy < %.0f%%): rows/s x%.2f, relay CPU per row x%.2f (target rows/s >= 0.90)",
				v.what, w.Name, v.consumer, n, 100*quietPair, rate, cpu)
		}
	}
	// The aggregate dimension: the ordering gate lets one message per
	// aggregate be in flight (see docs on relay.order).
	if many, hot := summaryOf(res, "1kb-x100", cRelayKafka), summaryOf(res, "1kb-x100-hot", cRelayKafka); many != nil && hot != nil && many.RowsPerSec > 0 && many.CPUPer100k > 0 {
		check(hot.RowsPerSec/many.RowsPerSec >= 0.5, "ordering gate: relay->kafka with one hot aggregate %.0f rows/s against %.0f with 1,000 aggregates (1 KB, 100 rows/txn, medians): rows/s x%.2f, relay CPU per row x%.2f (target >= 0.50)",
			hot.RowsPerSec, many.RowsPerSec, hot.RowsPerSec/many.RowsPerSec, hot.CPUPer100k/many.CPUPer100k)
	}
	if w := workloadOf(res, "1kb-x100-hot"); w != nil {
		// pairedRatios leaves out a run whose broker did not hold exactly
		// the backlog (measurement.timed).
		if rate, cpu, n := pairedRatios(w.Runs, cRelayKafka, cRelayKafkaNoOrder, math.Inf(1)); n > 0 {
			info("cost of the order guarantee at %s: relay->kafka (relay.order: aggregate) / relay->kafka order:none, median of %d interleaved pairs: rows/s x%.2f, relay CPU per row x%.2f",
				w.Name, n, rate, cpu)
		} else {
			out = append(out, fmt.Sprintf("n/a    cost of the order guarantee at %s: no repetition timed both relay->kafka and relay->kafka order:none that holds exactly the backlog and was timed above 0 s", w.Name))
		}
	}
	// pg_recvlogical's own rate swings by a third from run to run on a
	// shared machine, and the medians of two series can come from runs
	// minutes apart: the target is the median of the ratios of the runs
	// made one after the other (a repetition's pair). The relay with
	// 1,000 aggregates in the same run shows the gate's own cost.
	if w, m, ref := workloadOf(res, "1kb-x100-64agg"), summaryOf(res, "1kb-x100-64agg", cRelayKafka), summaryOf(res, "1kb-x100-64agg", cRecvlogical); w != nil && m != nil && ref != nil && ref.RowsPerSec > 0 {
		if rate, _, n := pairedRatios(w.Runs, cRelayKafka, cRecvlogical, math.Inf(1)); n > 0 {
			many := ""
			if k := summaryOf(res, "1kb-x100", cRelayKafka); k != nil && k.RowsPerSec > 0 {
				many = fmt.Sprintf("; x%.2f of relay->kafka's %.0f rows/s with 1,000 aggregates (medians)", m.RowsPerSec/k.RowsPerSec, k.RowsPerSec)
			}
			check(rate >= 0.95, "ordering gate: relay->kafka with 64 aggregates %.0f rows/s against pg_recvlogical's %.0f (medians, %.2f); median of %d interleaved pairs %.2f%s (target: the pairs' median >= 0.95)",
				m.RowsPerSec, ref.RowsPerSec, m.RowsPerSec/ref.RowsPerSec, n, rate, many)
		}
	}
	for _, t := range []struct {
		workload, what string
		goal           float64 // 0: no target, shown for information
	}{{"1kb-x100-64agg", "64 aggregates", 0.9}, {"1kb-x100-hot", "one hot aggregate", 0}} {
		w := workloadOf(res, t.workload)
		if w == nil {
			continue
		}
		rate, cpu, n := pairedRatios(w.Runs, cRelayRabbit, cBareAMQP, 1)
		if n == 0 {
			continue
		}
		line := fmt.Sprintf("ordering gate: relay->rabbitmq with %s: %.0f rows/s against the bare amqp091 publisher's %.0f (medians); median of %d interleaved pairs x%.2f, relay CPU per row x%.2f",
			t.what, summaryOf(res, t.workload, cRelayRabbit).RowsPerSec, summaryOf(res, t.workload, cBareAMQP).RowsPerSec, n, rate, cpu)
		if t.goal == 0 {
			info("%s", line)
		} else {
			check(rate >= t.goal, "%s (target >= %.2f)", line, t.goal)
		}
	}
	if l := res.Latency; l != nil && l.Received > 0 {
		bare := "no bare-loop reference"
		if b := l.Bare; b != nil && b.Received > 0 {
			bare = fmt.Sprintf("bare pglogrepl loop p50 %.2f  p99 %.2f  p99.9 %.2f  max %.2f ms", b.P50, b.P99, b.P999, b.Max)
		}
		check(l.P99 <= 3 && l.P999 <= 10, "commit-to-consumer at %d rows/s: p50 %.2f  p99 %.2f  p99.9 %.2f  max %.2f ms; %s (target p99 <= 3, p99.9 <= 10)",
			l.Rate, l.P50, l.P99, l.P999, l.Max, bare)
		// The tail against the loop producing with franz-go, timed over the
		// same span: commit to receipt by the measuring consumer.
		if b := l.BareProduce; b != nil && b.Receipt != nil && b.Receipt.P99 > 0 && b.Receipt.P999 > 0 {
			r := b.Receipt
			p99, p999 := l.P99/r.P99, l.P999/r.P999
			check(p99 <= 1.2 && p999 <= 1.2, "latency tail at %d rows/s, commit to consumer receipt: relay p99 %.2f, p99.9 %.2f ms; the bare loop producing with franz-go p99 %.2f, p99.9 %.2f ms (%d records): x%.2f and x%.2f (target <= x1.2 each)",
				l.Rate, l.P99, l.P999, r.P99, r.P999, r.Received, p99, p999)
		} else {
			info("latency tail against the bare loop producing with franz-go: missing, no record of that loop reached the consumer")
		}
		ref := ""
		if b := l.Bare; b != nil && b.Received > 0 {
			ref = fmt.Sprintf("; the bare loop %.0f µs and %.1f switches per row", b.CPUPerRow, b.SwitchesPerRow)
		}
		if b := l.BareProduce; b != nil && b.Received > 0 {
			ref += fmt.Sprintf(", the bare loop producing with franz-go %.0f µs and %.1f switches (relay x%.2f)", b.CPUPerRow, b.SwitchesPerRow, l.RelayCPUPerRow/b.CPUPerRow)
		}
		if m := summaryOf(res, "1kb-x100", cRelayKafka); m != nil && m.CPUPer100k > 0 {
			ref += fmt.Sprintf("; in the 1kb-x100 bulk drain the relay %.1f µs per row", m.CPUPer100k*10)
			if b := summaryOf(res, "1kb-x100", cPglogrepl); b != nil && b.CPUPer100k > 0 {
				ref += fmt.Sprintf(", the bare loop %.1f", b.CPUPer100k*10)
			}
		}
		check(l.RelayCPUPerRow <= 50, "relay CPU at %d rows/s: %.0f µs and %.1f context switches (%.1f voluntary) per row%s (target <= 50 µs)",
			l.Rate, l.RelayCPUPerRow, l.RelaySwitchesPerRow, l.RelayVoluntaryPerRow, ref)
	}
	if peak > 0 {
		check(peak < 150, "relay peak RSS: %.0f MB, in %s (target < 150 MB)", peak, peakAt)
	}
	// Big transactions in bounded memory (README): a transaction's rows
	// pass through the in-flight window, so the relay's peak RSS does not
	// grow with the transaction.
	if big := workloadOf(res, "200b-1tx"); big != nil {
		for _, consumer := range []string{cRelayKafka, cRelayRabbit} {
			rss := peakRSSOf(big, consumer)
			if rss == 0 {
				continue
			}
			small := ""
			if w := workloadOf(res, "200b-x100"); w != nil && peakRSSOf(w, consumer) > 0 {
				small = fmt.Sprintf(", against %.0f MB for %d such rows 100 per transaction (200b-x100)", peakRSSOf(w, consumer), w.Rows)
			}
			check(rss < 150, "big transaction in bounded memory: %s peak RSS %.0f MB (VmHWM, highest run) for one %d-row transaction whose payloads alone are %.0f MB%s (target < 150 MB)",
				consumer, rss, big.Rows, big.payloadBytes()/1e6, small)
		}
	}
	return out
}

// peakRSSOf returns the highest peak RSS of consumer's runs in w.
func peakRSSOf(w *workloadResult, consumer string) float64 {
	peak := 0.0
	for _, m := range w.Runs {
		if m.Consumer == consumer {
			peak = max(peak, m.PeakRSSMB)
		}
	}
	return peak
}

func workloadOf(res *results, name string) *workloadResult {
	for i := range res.Workloads {
		if res.Workloads[i].Name == name {
			return &res.Workloads[i]
		}
	}
	return nil
}

// summaryOf returns the median measurement of consumer in workload name.
func summaryOf(res *results, name, consumer string) *measurement {
	for _, w := range res.Workloads {
		if w.Name != name {
			continue
		}
		for i := range w.Summary {
			if w.Summary[i].Consumer == consumer {
				return &w.Summary[i]
			}
		}
	}
	return nil
}

// quietPair is the most the rest of the machine may use, as a share of its
// CPU, during both runs of a pair that counts for a target.
const quietPair = 0.25

// pairedRatios compares consumer a with b run by run: the medians of
// a/b rows/s and of a/b CPU per row over the n repetitions where both ran
// while the rest of the machine used under maxBusy of its CPU. On a shared
// machine a burst of load from elsewhere moved one relay run from 110,000
// to 9,000 rows/s: such runs say nothing about the cost of a feature.
func pairedRatios(runs []measurement, a, b string, maxBusy float64) (rate, cpu float64, n int) {
	byRep := map[int]measurement{}
	for _, m := range runs {
		if m.Consumer == b && m.timed() && m.OthersBusy < maxBusy {
			byRep[m.Rep] = m
		}
	}
	var rates, cpus []float64
	for _, m := range runs {
		ref, ok := byRep[m.Rep]
		if m.Consumer != a || !m.timed() || m.OthersBusy >= maxBusy || !ok || ref.RowsPerSec == 0 || ref.CPUPer100k == 0 {
			continue
		}
		rates = append(rates, m.RowsPerSec/ref.RowsPerSec)
		cpus = append(cpus, m.CPUPer100k/ref.CPUPer100k)
	}
	median := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return median(rates), median(cpus), len(rates)
}

// print writes a latency reference's lines: what it is, how many rows it
// counted, its latencies (what names their span) and cost, and its error.
func (b *bareLatencyResult) print(out io.Writer, what, counted, span, name string) {
	if b == nil {
		return
	}
	fmt.Fprintf(out, "  reference, %s: %d %s\n", what, b.Received, counted)
	fmt.Fprintf(out, "    %s: p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms; %.0f µs, %.1f context switches (%.1f voluntary) per row\n",
		span, b.P50, b.P99, b.P999, b.Max, b.CPUPerRow, b.SwitchesPerRow, b.VoluntaryPerRow)
	if r := b.Receipt; r != nil {
		fmt.Fprintf(out, "    commit -> consumer receipt (%d records): p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms\n", r.Received, r.P50, r.P99, r.P999, r.Max)
	}
	if b.Error != "" {
		fmt.Fprintf(out, "    %s: %s\n", name, b.Error)
	}
}

// printReport prints the table and the latency.
func printReport(out io.Writer, res *results) {
	fmt.Fprintf(out, "\n== results (%s, %d CPUs, load %.2f at start, PostgreSQL %s, %s%s)\n",
		res.Started.Format(time.RFC3339), res.CPUs, res.LoadAvg, res.PostgreSQL, res.Commit, map[bool]string{true: "+dirty", false: ""}[res.Dirty])
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tconsumer\trows/s\t(min-max)\tMB/s\tcpu s/100k\twalsender s/100k\tbroker s/100k\tpeak RSS MB\tconfirm +s\tratio\tof\tothers busy\t")
	for _, w := range res.Workloads {
		for _, m := range w.Summary {
			if m.Seconds == 0 {
				fmt.Fprintf(tw, "%s\t%s\tfailed\t\t\t\t\t\t\t\t\t\t\t\n", w.Name, m.Consumer)
				continue
			}
			spread := ""
			if m.Reps > 1 {
				spread = fmt.Sprintf("%.0f-%.0f", m.RowsPerSecMin, m.RowsPerSecMax)
			}
			kf, lag := "", ""
			if m.BrokerCPUPer100k > 0 {
				kf = fmt.Sprintf("%.2f", m.BrokerCPUPer100k)
			}
			if m.ConfirmLagSeconds > 0 {
				lag = fmt.Sprintf("%.2f", m.ConfirmLagSeconds)
			}
			rss, ratio := "-", "-"
			if m.PeakRSSMB > 0 {
				rss = fmt.Sprintf("%.0f", m.PeakRSSMB)
			}
			if m.RatioOf != "" {
				ratio = fmt.Sprintf("%.2f", m.Ratio)
			}
			cpu := fmt.Sprintf("%.2f", m.CPUPer100k)
			if m.inProcess {
				cpu += "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%.1f\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t\n",
				w.Name, m.Consumer, m.RowsPerSec, spread, m.MBPerSec, cpu, m.WalsenderCPUPer100k, kf, rss, lag, ratio, m.RatioOf, 100*m.OthersBusy)
		}
	}
	tw.Flush()
	for _, line := range []string{
		"rows/s: median of the repetitions (min-max; of two, the faster), from the start of the consumer's walsender",
		"  until it has every row:",
		"  pg_recvlogical exits at --endpos, the bare loop passes the end LSN, the relay's broker holds every row",
		"  (kfake end offsets polled every 10 ms / queue depth every 50 ms), the bare publisher has every confirm.",
		"confirm +s: for the relay, from the broker holding every row to confirmed_flush_lsn passing the backlog",
		"  (polled every 50 ms): the relay's 1 s checkpoint cadence plus postgres.status_interval (100 ms here).",
		"cpu s/100k: CPU seconds of the consumer process per 100,000 rows (relay: the binary, from /proc; * = this",
		"  process, where the bare Go consumers run). walsender: the PostgreSQL process decoding for it. broker: kfake",
		"  (this process) or the RabbitMQ server (beam.smp). MB/s counts payload bytes. ratio: median over median.",
		"others busy: share of the machine's CPU used by anything else meanwhile (other PostgreSQL processes, RabbitMQ,",
		"  other users of the machine): high values mean a noisy measurement.",
	} {
		fmt.Fprintln(out, "  "+line)
	}
	for _, w := range res.Workloads {
		for _, m := range w.Summary {
			if m.Note != "" {
				fmt.Fprintf(out, "  note %s %s: %s\n", w.Name, m.Consumer, m.Note)
			}
		}
		for _, n := range w.Notes {
			fmt.Fprintf(out, "  note %s: %s\n", w.Name, n)
		}
	}
	if l := res.Latency; l != nil {
		fmt.Fprintf(out, "\n== latency: %s\n", l.What)
		fmt.Fprintf(out, "  %d rows at %.0f rows/s (target %d), %d received, %d duplicates\n", l.Inserted, l.Achieved, l.Rate, l.Received, l.Duplicates)
		fmt.Fprintf(out, "  commit -> consumer receipt: p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms\n", l.P50, l.P99, l.P999, l.Max)
		if l.RelayBuckets != nil {
			fmt.Fprintf(out, "  commit -> ack by the relay's own histogram (/metrics): p50 <= %s ms  p99 <= %s ms\n", orMissing(l.RelayP50Le), orMissing(l.RelayP99Le))
		}
		fmt.Fprintf(out, "  relay: %.2f CPU s over the run (%.0f µs, %.1f context switches, %.1f of them voluntary, per row), peak RSS %.0f MB; the rest of the machine used %.0f%% of its CPU meanwhile\n",
			l.RelayCPUSeconds, l.RelayCPUPerRow, l.RelaySwitchesPerRow, l.RelayVoluntaryPerRow, l.PeakRSSMB, 100*l.OthersBusy)
		l.Bare.print(out, "a bare pglogrepl loop on its own slot and process, same transactions at the same time", "received",
			"commit -> receipt of the Commit message", "bare loop")
		l.BareProduce.print(out, "the same loop producing each transaction's insert with franz-go (acks=all, idempotent, no linger) to the relay's kfake and confirming it once acknowledged, on a third slot and process", "acknowledged",
			"commit -> acknowledgement", "bare loop with a producer")
		for _, w := range l.Slow {
			fmt.Fprintf(out, "  slow: %d rows over 20 ms committed between %.2fs and %.2fs into the run, up to %.1f ms\n", w.Rows, w.From, w.To, w.MaxMS)
		}
	}
	fmt.Fprintln(out, "\n== targets")
	for _, t := range res.Targets {
		fmt.Fprintln(out, "  "+t)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(out, "  note:", n)
	}
	printSinkRows(out, res.Sinks)
	fmt.Fprintf(out, "  total %.0fs\n", res.Seconds)
}

// orMissing formats a figure the bench may not have been able to compute.
func orMissing(v *float64) string {
	if v == nil {
		return "(missing)"
	}
	return strconv.FormatFloat(*v, 'g', -1, 64)
}
