package integration

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// spreadSample is one look at the six slots and the three relays.
type spreadSample struct {
	at    time.Time
	pids  map[string]int // slot -> active_pid, 0 when inactive
	ready map[string]int // pipeline -> how many relays answer /readyz?pipeline= 200
	alive []bool         // which relays were running
}

// backendPIDs maps each walsender a relay's log names (the "streaming"
// line's backend_pid) to that relay.
var backendPIDRE = regexp.MustCompile(`"backend_pid":(\d+)`)

func backendPIDs(procs []*proc) map[int]int {
	out := map[int]int{}
	for i, p := range procs {
		for _, m := range backendPIDRE.FindAllStringSubmatch(p.out.String(), -1) {
			pid, _ := strconv.Atoi(m[1])
			out[pid] = i
		}
	}
	return out
}

// TestReplicasSpreadPipelines: three relays with one configuration of six
// pipelines (six databases, six slots) share them two each; one is killed
// with -9 under load and its two pipelines move to the others, three
// each. Sampled every 200 ms throughout, no pipeline is streamed by two
// relays at once (the slots' active_pid, each relay's /readyz), and the
// producers that wrote each pipeline's records never overlap in time: one
// publisher per pipeline at every moment. Nothing is lost.
func TestReplicasSpreadPipelines(t *testing.T) {
	const n = 6
	envs := make([]*env, n)
	var pipelines strings.Builder
	for i := range envs {
		envs[i] = newEnvWith(t, serverFor(t), "", "--slot", fmt.Sprintf("spread_%d", i))
		fmt.Fprintf(&pipelines, "  - name: p%d\n    postgres:\n      url: %s\n      slot: spread_%d\n    sink:\n      kafka:\n        brokers: [%s]\n",
			i, envs[i].dbURL, i, envs[i].brokers)
	}
	path := envs[0].writeConfig("postgres:\n  status_interval: 200ms\nsink:\n  type: kafka\nhttp:\n  listen: 127.0.0.1:0\npipelines:\n" + pipelines.String())
	procs := make([]*proc, 3)
	bases := make([]string, 3)
	for i := range procs {
		procs[i] = envs[0].startCmd(relayCommand(path))
	}
	for i, p := range procs {
		bases[i] = "http://" + p.httpAddr()
		waitReady(t, bases[i]+"/readyz?standby=ok", 200, 60*time.Second)
	}
	consumers := make([]*consumer, n)
	for i, e := range envs {
		consumers[i] = e.consume("outbox.order")
	}

	var mu sync.Mutex
	var samples []spreadSample
	alive := []bool{true, true, true}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	sampleDB := connectT(t, envs[0].dbURL) // the sampler's own: a pgx.Conn serves one caller
	db := envs[0].db
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(200 * time.Millisecond):
			}
			s := spreadSample{at: time.Now(), pids: map[string]int{}, ready: map[string]int{}}
			rows, err := sampleDB.Query(t.Context(), "SELECT slot_name, coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name LIKE 'spread_%'")
			if err != nil {
				t.Errorf("sample the slots: %v", err)
				return
			}
			for rows.Next() {
				var slot string
				var pid int
				if err := rows.Scan(&slot, &pid); err != nil {
					t.Errorf("sample the slots: %v", err)
				}
				s.pids[slot] = pid
			}
			rows.Close()
			mu.Lock()
			s.alive = append([]bool(nil), alive...)
			mu.Unlock()
			for r, base := range bases {
				if !s.alive[r] {
					continue
				}
				for i := range n {
					if code, _ := getQuiet(base + fmt.Sprintf("/readyz?pipeline=p%d", i)); code == 200 {
						s.ready[fmt.Sprintf("p%d", i)]++
					}
				}
			}
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
		}
	}()
	// holders is, for each relay, how many slots it streams now.
	holders := func() ([]int, map[string]int) {
		pids := backendPIDs(procs)
		owner := map[string]int{}
		count := make([]int, len(procs))
		rows, err := db.Query(t.Context(), "SELECT slot_name, coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name LIKE 'spread_%'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var slot string
			var pid int
			if err := rows.Scan(&slot, &pid); err != nil {
				t.Fatal(err)
			}
			if r, ok := pids[pid]; ok && pid != 0 {
				owner[slot] = r
				count[r]++
			}
		}
		return count, owner
	}
	waitSpread := func(want []int, timeout time.Duration) map[string]int {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			count, owner := holders()
			if fmt.Sprint(count) == fmt.Sprint(want) && len(owner) == n {
				return owner
			}
			if time.Now().After(deadline) {
				t.Fatalf("slots streamed per relay: %v (owners %v), want %v within %s", count, owner, want, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	balanced := time.Now()
	before := waitSpread([]int{2, 2, 2}, 30*time.Second)
	t.Logf("balanced two each in %s: %v", time.Since(balanced).Round(100*time.Millisecond), before)

	loads := make([]*loader, n)
	for i, e := range envs {
		loads[i] = startLoader(t, e.dbURL, fmt.Sprintf("p%d", i), 50*time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	mu.Lock()
	alive[0] = false
	mu.Unlock()
	killedAt := time.Now()
	procs[0].kill()
	var moved []string
	for slot, r := range before {
		if r == 0 {
			moved = append(moved, slot)
		}
	}
	after := waitSpread([]int{0, 3, 3}, 30*time.Second)
	takeover := time.Since(killedAt)
	time.Sleep(2 * time.Second)
	ledgers := make([][]string, n)
	for i, l := range loads {
		ledgers[i] = l.stop(t)
	}
	var rows, dups int
	for i, c := range consumers {
		recs := c.waitIDs(ledgers[i], 60*time.Second)
		rows += len(ledgers[i])
		dups += duplicates(recs)
		if order := checkOrder(ledgers[i], recs); order != 0 {
			t.Errorf("pipeline p%d: %d records out of their aggregate's order", i, order)
		}
		checkOnePublisher(t, fmt.Sprintf("p%d", i), recs)
	}
	close(stopSampling)
	<-sampled

	sort.Strings(moved)
	for _, slot := range moved {
		if after[slot] == 0 {
			t.Errorf("slot %s of the killed relay did not move", slot)
		}
	}
	// Every sample: at most one relay streams a pipeline; a slot's walsender
	// is one of the relays'. After the takeover: exactly one.
	pids := backendPIDs(procs)
	var overlaps, unknown, exactly int
	mu.Lock()
	for _, s := range samples {
		for name, k := range s.ready {
			if k > 1 {
				overlaps++
				t.Errorf("%s: pipeline %s ready on %d relays at once", s.at.Format(time.StampMilli), name, k)
			}
		}
		for slot, pid := range s.pids {
			if _, ok := pids[pid]; pid != 0 && !ok {
				unknown++
				t.Errorf("%s: slot %s streamed by backend %d, which no relay's log names", s.at.Format(time.StampMilli), slot, pid)
			}
		}
	}
	last := samples[len(samples)-1]
	for i := range n {
		if k := last.ready[fmt.Sprintf("p%d", i)]; k != 1 {
			t.Errorf("after the takeover pipeline p%d is ready on %d relays, want 1", i, k)
		} else {
			exactly++
		}
	}
	nSamples := len(samples)
	mu.Unlock()
	t.Logf("replicas: 3 relays, %d pipelines, rows %d, lost 0, duplicates %d; killed relay 0 holding %v, moved in %s to %v; %d samples, %d with a pipeline on two relays, %d unknown walsenders, %d of %d pipelines on exactly one relay at the end",
		n, rows, dups, moved, takeover.Round(100*time.Millisecond), after, nSamples, overlaps, unknown, exactly, n)
	if nSamples < 20 {
		t.Errorf("only %d samples", nSamples)
	}
	for _, p := range procs[1:] {
		p.stop()
	}
}

// checkOnePublisher fails when two producers (relay sink clients) wrote
// records of one pipeline at overlapping times: each producer's records,
// first to last by their producer timestamps, must come before the next
// producer's first.
func checkOnePublisher(t *testing.T, name string, recs []record) {
	t.Helper()
	type span struct {
		id          int64
		first, last time.Time
	}
	spans := map[int64]*span{}
	for _, r := range recs {
		if r.ProducerID <= 0 {
			t.Fatalf("pipeline %s: a record without an idempotent producer id", name)
		}
		s := spans[r.ProducerID]
		if s == nil {
			s = &span{id: r.ProducerID, first: r.Timestamp, last: r.Timestamp}
			spans[r.ProducerID] = s
		}
		if r.Timestamp.Before(s.first) {
			s.first = r.Timestamp
		}
		if r.Timestamp.After(s.last) {
			s.last = r.Timestamp
		}
	}
	var list []*span
	for _, s := range spans {
		list = append(list, s)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].first.Before(list[j].first) })
	for i := 1; i < len(list); i++ {
		if !list[i-1].last.Before(list[i].first) {
			t.Errorf("pipeline %s: producers %d (%s..%s) and %d (%s..%s) published at the same time", name,
				list[i-1].id, list[i-1].first.Format(time.StampMilli), list[i-1].last.Format(time.StampMilli),
				list[i].id, list[i].first.Format(time.StampMilli), list[i].last.Format(time.StampMilli))
		}
	}
	t.Logf("pipeline %s: %d records from %d producers in turn", name, len(recs), len(list))
}

// getQuiet is a GET that reports a failure as status 0, for samplers
// that outlive a relay.
func getQuiet(url string) (int, string) {
	resp, err := quietClient.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var quietClient = &http.Client{Timeout: 2 * time.Second}
