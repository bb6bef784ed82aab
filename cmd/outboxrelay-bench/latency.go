package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// latencyResult is the live run: rows inserted one per transaction at a
// fixed rate with synchronous_commit on, relayed into kfake.
type latencyResult struct {
	What       string  `json:"what"`
	Rate       int     `json:"target_rows_per_sec"`
	Achieved   float64 `json:"achieved_rows_per_sec"`
	Inserted   int     `json:"inserted"`
	Received   int     `json:"received"`
	Duplicates int     `json:"duplicates"`
	// Commit to receipt by a consumer, in milliseconds: an upper bound of
	// commit to ack.
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	// The relay's own view, from its end_to_end_latency_seconds histogram
	// (commit to the broker's ack, as the relay sees it): the upper bounds
	// of the buckets that hold the median and the 99th percentile, in
	// milliseconds (null when they cannot be computed: no histogram, no
	// sample, or a quantile in the +Inf bucket), and the cumulative counts
	// per bucket.
	RelayP50Le      *float64           `json:"relay_histogram_p50_le_ms"`
	RelayP99Le      *float64           `json:"relay_histogram_p99_le_ms"`
	RelayBuckets    map[string]float64 `json:"relay_histogram_buckets,omitempty"`
	RelayCPUSeconds float64            `json:"relay_cpu_seconds"`
	// RelayCPUPerRow is RelayCPUSeconds per received row in microseconds;
	// RelaySwitchesPerRow counts the context switches of all the relay's
	// threads per row (voluntary ones are a thread going to sleep).
	RelayCPUPerRow       float64 `json:"relay_cpu_us_per_row"`
	RelaySwitchesPerRow  float64 `json:"relay_context_switches_per_row"`
	RelayVoluntaryPerRow float64 `json:"relay_voluntary_switches_per_row"`
	// Bare is the reference: a bare pglogrepl loop on a slot of its own,
	// in a process of its own, receiving the same transactions at the same
	// time (see bareLatencyMain).
	Bare *bareLatencyResult `json:"bare_pglogrepl,omitempty"`
	// BareProduce is the second reference: the bare loop producing each
	// transaction's insert to the same kfake with franz-go and confirming
	// it once acknowledged (-produce), on a third slot and process. Its
	// latencies run from commit to the acknowledgement.
	BareProduce *bareLatencyResult `json:"bare_pglogrepl_franz_go,omitempty"`
	// Slow lists, for rows over 20 ms, when they committed (seconds into
	// the run) and their latency, merged into windows; OthersBusy is the
	// machine's CPU share used by everything but the relay, PostgreSQL and
	// this process during the run.
	Slow       []slowWindow `json:"slow,omitempty"`
	OthersBusy float64      `json:"others_busy_share"`
	PeakRSSMB  float64      `json:"peak_rss_mb"`
}

// bareLatencyResult is the bare loop's side of the latency run: commit to
// the loop's receipt of the Commit message, in milliseconds, and its cost.
type bareLatencyResult struct {
	Received        int     `json:"received"`
	P50             float64 `json:"p50_ms"`
	P99             float64 `json:"p99_ms"`
	P999            float64 `json:"p999_ms"`
	Max             float64 `json:"max_ms"`
	CPUPerRow       float64 `json:"cpu_us_per_row"`
	SwitchesPerRow  float64 `json:"context_switches_per_row"`
	VoluntaryPerRow float64 `json:"voluntary_switches_per_row"`
	Error           string  `json:"error,omitempty"`
	// Receipt is, for the loop producing with franz-go, commit to receipt
	// by the measuring consumer, the span the relay's figures cover; null
	// when no record of the loop arrived.
	Receipt *quantiles `json:"consumer_receipt,omitempty"`
}

// quantiles are latencies in milliseconds.
type quantiles struct {
	Received int     `json:"received"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	Max      float64 `json:"max_ms"`
}

func quantilesOf(v []float64) *quantiles {
	return &quantiles{Received: len(v), P50: quantile(v, 0.5), P99: quantile(v, 0.99), P999: quantile(v, 0.999), Max: quantile(v, 1)}
}

// bareReceipt is the time in milliseconds from the commit that r's
// commitHeader carries to now, r's receipt.
func bareReceipt(r *kgo.Record, now time.Time) (float64, error) {
	for _, h := range r.Headers {
		if h.Key == commitHeader {
			us, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("reference record at offset %d: %s header %q: %w", r.Offset, commitHeader, h.Value, err)
			}
			return ms(now.Sub(time.UnixMicro(us))), nil
		}
	}
	return 0, fmt.Errorf("reference record at offset %d has no %s header", r.Offset, commitHeader)
}

// slowWindow is a stretch of rows that took over 20 ms.
type slowWindow struct {
	From, To float64 // seconds into the run, by commit time
	Rows     int
	MaxMS    float64 `json:"max_ms"`
}

type envelopeTimes struct {
	MessageID string `json:"message_id"`
	Source    struct {
		CommittedAt string `json:"committed_at"`
	} `json:"source"`
}

// runLatency inserts rate rows/s for d and measures, for every row, the time
// from its commit (the envelope's source.committed_at, PostgreSQL's clock)
// to the moment a franz-go consumer in this process receives it (the same
// clock). kfake makes a record readable as soon as it appends it, just
// before it answers the produce request, so this is commit to ack plus
// the consumer's fetch turnaround.
func runLatency(ctx context.Context, env *benchEnv, rate int, d time.Duration, profile bool) (*latencyResult, error) {
	db := "bench_latency"
	url, err := env.prepareDatabase(ctx, db)
	if err != nil {
		return nil, err
	}
	defer env.dropDatabase(db)
	kf, err := newKafka()
	if err != nil {
		return nil, err
	}
	defer kf.Close()
	broker := kf.ListenAddrs()[0]

	const slot, bareSlot, produceSlot = "latency_relay", "latency_bare", "latency_bare_produce"
	if err := createSlots(ctx, url, []string{slot, bareSlot, produceSlot}); err != nil {
		return nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startRelay(env, "relay-latency", kafkaConfig(url, broker, listen), slot)
	if err != nil {
		return nil, err
	}
	defer p.stop() // reported by the measurement below when it matters
	if err := waitActive(ctx, url, slot, p.done, "relay (log "+p.log+")"); err != nil {
		return nil, err
	}
	n := int(d.Seconds() * float64(rate))
	bare, err := startBareLoop(env, url, bareSlot, n)
	if err != nil {
		return nil, err
	}
	defer bare.stop()
	if err := waitActive(ctx, url, bareSlot, bare.done, "bare loop"); err != nil {
		return nil, err
	}
	bareProduce, err := startBareLoop(env, url, produceSlot, n, "-produce", broker)
	if err != nil {
		return nil, err
	}
	defer bareProduce.stop()
	if err := waitActive(ctx, url, produceSlot, bareProduce.done, "bare loop with a producer"); err != nil {
		return nil, err
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic, bareTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	type sample struct{ recv, committed time.Time }
	var (
		mu      sync.Mutex
		samples = map[string]sample{}
		dups    int
		bad     error
		// The reference's records, timed the same way: commit to receipt
		// by this consumer, in milliseconds.
		bareRecv []float64
		bareSeen = map[[2]int64]bool{} // partition, offset
	)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				if r.Topic == bareTopic {
					l, err := bareReceipt(r, now)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						bad = err
					} else if at := [2]int64{int64(r.Partition), r.Offset}; !bareSeen[at] {
						bareSeen[at] = true
						bareRecv = append(bareRecv, l)
					}
					return
				}
				var e envelopeTimes
				if err := json.Unmarshal(r.Value, &e); err != nil {
					mu.Lock()
					bad = fmt.Errorf("record is not an envelope: %w", err)
					mu.Unlock()
					return
				}
				t, err := time.Parse("2006-01-02T15:04:05.000000Z", e.Source.CommittedAt)
				if err != nil {
					mu.Lock()
					bad = fmt.Errorf("committed_at %q: %w", e.Source.CommittedAt, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				if _, ok := samples[e.MessageID]; ok {
					dups++
				} else {
					samples[e.MessageID] = sample{recv: now, committed: t}
				}
				mu.Unlock()
			})
		}
	})

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		return nil, err
	}
	gen := newRowGen(1024)
	interval := time.Second / time.Duration(rate)
	var perf *exec.Cmd
	var perfData string
	if profile {
		if perfData, err = profilePath(env, "relay-latency", "the measured run, under perf record"); err != nil {
			return nil, err
		}
		perf = exec.Command("perf", "record", "-q", "-F", "1999", "-g", "-p", strconv.Itoa(p.cmd.Process.Pid), "-o", perfData)
		perf.Stdout, perf.Stderr = os.Stderr, os.Stderr
		if err := perf.Start(); err != nil {
			perf = nil
			fmt.Fprintln(os.Stderr, "perf record:", err)
		}
	}
	cpu0, sw0 := readProc(p.cmd.Process.Pid).cpu, contextSwitches(p.cmd.Process.Pid)
	busy0, self0, pg0 := machineBusy(), selfCPU(), postgresCPU(env.pg.DataDir())
	start := time.Now()
	var params [][]byte
	for i := range n {
		// A fixed schedule: a slow insert is caught up at once rather than
		// shifting every later one.
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		params = gen.next(params[:0])
		if _, err := conn.Exec(ctx, "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4)",
			string(params[0]), string(params[1]), string(params[2]), string(params[3])); err != nil {
			return nil, fmt.Errorf("insert: %w", err)
		}
	}
	elapsed := time.Since(start)

	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got, bareGot := len(samples), len(bareRecv)
		mu.Unlock()
		if got >= n && bareGot >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rs := readProc(p.cmd.Process.Pid)
	sw := contextSwitches(p.cmd.Process.Pid).minus(sw0)
	others := machineBusy() - busy0 - (selfCPU() - self0) - (rs.cpu - cpu0) - (postgresCPU(env.pg.DataDir()) - pg0)
	wall := time.Since(start)
	bl, bareErr := bare.result(max(time.Until(deadline), time.Second))
	bp, produceErr := bareProduce.result(max(time.Until(deadline), time.Second))
	if perf != nil {
		_ = perf.Process.Signal(syscall.SIGINT)
		_ = perf.Wait()
		if err := perfReport(ctx, perfData); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		}
	}
	// The bare loop's CPU is its own process's: take it out of the others'.
	others -= time.Duration((bl.CPUSeconds + bp.CPUSeconds) * float64(time.Second))
	cancel()
	wg.Wait()
	buckets, histErr := scrapeLatency(ctx, listen)

	mu.Lock()
	defer mu.Unlock()
	if bad != nil {
		return nil, bad
	}
	res := &latencyResult{
		What:     "commit (envelope source.committed_at) to receipt by a franz-go consumer of kfake; 1 KB rows, 1 row/txn, synchronous_commit=on (the server runs fsync=off)" + map[bool]string{true: "; the relay ran under perf record", false: ""}[perf != nil],
		Rate:     rate,
		Achieved: float64(n) / elapsed.Seconds(),
		Inserted: n, Received: len(samples), Duplicates: dups,
		RelayCPUSeconds: (rs.cpu - cpu0).Seconds(), PeakRSSMB: float64(rs.hwmKiB) / 1024,
	}
	res.OthersBusy = max(others.Seconds(), 0) / (wall.Seconds() * float64(runtime.NumCPU()))
	if len(samples) > 0 {
		rows := float64(len(samples))
		res.RelayCPUPerRow = res.RelayCPUSeconds * 1e6 / rows
		res.RelaySwitchesPerRow, res.RelayVoluntaryPerRow = float64(sw.total())/rows, float64(sw.voluntary)/rows
	}
	res.Bare, res.BareProduce = bl.result(bareErr), bp.result(produceErr)
	if len(bareRecv) > 0 {
		res.BareProduce.Receipt = quantilesOf(bareRecv)
	}
	var recv []float64
	type slow struct{ at, ms float64 }
	var slows []slow
	for _, s := range samples {
		l := ms(s.recv.Sub(s.committed))
		recv = append(recv, l)
		if l > 20 {
			slows = append(slows, slow{s.committed.Sub(start).Seconds(), l})
		}
	}
	slices.SortFunc(slows, func(a, b slow) int { return cmpFloat(a.at, b.at) })
	for _, x := range slows {
		if n := len(res.Slow); n > 0 && x.at-res.Slow[n-1].To < 0.1 {
			w := &res.Slow[n-1]
			w.To, w.Rows, w.MaxMS = x.at, w.Rows+1, max(w.MaxMS, x.ms)
			continue
		}
		res.Slow = append(res.Slow, slowWindow{From: x.at, To: x.at, Rows: 1, MaxMS: x.ms})
	}
	res.P50, res.P99, res.P999, res.Max = quantile(recv, 0.5), quantile(recv, 0.99), quantile(recv, 0.999), quantile(recv, 1)
	if histErr == nil {
		res.RelayBuckets = map[string]float64{}
		for _, b := range buckets {
			res.RelayBuckets[strconv.FormatFloat(b.le*1000, 'g', -1, 64)+"ms"] = b.count
		}
		res.RelayP50Le, res.RelayP99Le = bucketQuantile(buckets, 0.5), bucketQuantile(buckets, 0.99)
	}
	if res.Received < n {
		return res, fmt.Errorf("only %d of %d rows arrived within 30s of the last insert (relay log %s)", res.Received, n, p.log)
	}
	return res, nil
}

// result summarises what a reference consumer reported, or why it failed.
func (bl bareLatency) result(err error) *bareLatencyResult {
	b := &bareLatencyResult{Received: len(bl.MS)}
	if err != nil {
		b.Error = err.Error()
	}
	if len(bl.MS) > 0 {
		b.P50, b.P99, b.P999, b.Max = quantile(bl.MS, 0.5), quantile(bl.MS, 0.99), quantile(bl.MS, 0.999), quantile(bl.MS, 1)
		if rows := float64(bl.Rows); rows > 0 {
			b.CPUPerRow = bl.CPUSeconds * 1e6 / rows
			b.SwitchesPerRow, b.VoluntaryPerRow = float64(bl.Voluntary+bl.Involuntary)/rows, float64(bl.Voluntary)/rows
		}
	}
	return b
}

type bucket struct{ le, count float64 }

func getMetrics(ctx context.Context, listen string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+listen+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// scrapeMetrics reads unlabelled samples from the relay's /metrics.
func scrapeMetrics(ctx context.Context, listen string, names ...string) (map[string]float64, error) {
	body, err := getMetrics(ctx, listen)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(body, "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[name] = v
		}
	}
	return out, nil
}

// scrapeLatency reads the relay's commit-to-ack histogram from /metrics.
func scrapeLatency(ctx context.Context, listen string) ([]bucket, error) {
	body, err := getMetrics(ctx, listen)
	if err != nil {
		return nil, err
	}
	return parseLatency(body)
}

// parseLatency returns the end_to_end_latency_seconds buckets in body, a
// Prometheus text exposition, ordered by upper bound. The series carry
// labels besides le (the slot, in any order): buckets with the same upper
// bound are summed over them.
func parseLatency(body string) ([]bucket, error) {
	const name = "outboxrelay_end_to_end_latency_seconds_bucket{"
	counts := map[float64]float64{}
	for line := range strings.SplitSeq(body, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		labels, count, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		le, ok := labelValue(labels, "le")
		if !ok {
			continue
		}
		l, err1 := strconv.ParseFloat(le, 64)
		c, err2 := strconv.ParseFloat(strings.TrimSpace(count), 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("unreadable latency bucket %q", line)
		}
		counts[l] += c
	}
	if len(counts) == 0 {
		return nil, errors.New("no end_to_end_latency_seconds histogram in /metrics")
	}
	out := make([]bucket, 0, len(counts))
	for l, c := range counts {
		out = append(out, bucket{le: l, count: c})
	}
	slices.SortFunc(out, func(a, b bucket) int { return cmpFloat(a.le, b.le) })
	return out, nil
}

// labelValue returns the value of label key in labels, the text between a
// sample's braces (k1="v1",k2="v2"); values here hold no escaped quotes.
func labelValue(labels, key string) (string, bool) {
	for labels != "" {
		k, rest, ok := strings.Cut(labels, "=\"")
		if !ok {
			return "", false
		}
		v, rest, ok := strings.Cut(rest, "\"")
		if !ok {
			return "", false
		}
		if strings.TrimSpace(k) == key {
			return v, true
		}
		labels = strings.TrimPrefix(rest, ",")
	}
	return "", false
}

// bucketQuantile returns the upper bound, in milliseconds, of the bucket
// holding the q-quantile, or nil when it cannot be computed: no sample, or
// the quantile lies beyond the last finite bound.
func bucketQuantile(bs []bucket, q float64) *float64 {
	if len(bs) == 0 {
		return nil
	}
	total := bs[len(bs)-1].count
	if total <= 0 {
		return nil
	}
	for _, b := range bs {
		if b.count >= q*total {
			if math.IsInf(b.le, 1) {
				return nil
			}
			v := b.le * 1000
			return &v
		}
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile returns the q-quantile of v (nearest rank); it sorts v.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	i := int(q*float64(len(v))+0.5) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// waitActive waits until a consumer streams from slot; done is closed when
// it exits, what names it in errors.
func waitActive(ctx context.Context, url, slot string, done <-chan struct{}, what string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var active bool
		if err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active); err != nil {
			return err
		}
		if active {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before streaming", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not start streaming within 30s", what)
}
