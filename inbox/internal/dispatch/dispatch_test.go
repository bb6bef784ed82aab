package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

type msg struct {
	key string
	seq int
}

// TestBatchesKeepOrderAndGroup: in batch mode a batch holds several
// aggregates' messages, each aggregate's in order, never two groups, and
// an abandoned message drops its aggregate's rest.
func TestBatchesKeepOrderAndGroup(t *testing.T) {
	var mu sync.Mutex
	var batches [][]msg
	gate := make(chan struct{})
	var dropped []msg
	ended := 0
	d := New(Config[msg]{
		MaxInFlight: 100, Batch: 8,
		Group: func(m msg) string { return m.key[:1] },
		ProcessBatch: func(ms []msg) []bool {
			<-gate
			mu.Lock()
			batches = append(batches, append([]msg(nil), ms...))
			mu.Unlock()
			oks := make([]bool, len(ms))
			for i, m := range ms {
				oks[i] = !(m.key == "a2" && m.seq == 3) // abandoned
			}
			return oks
		},
		Dropped: func(ms []msg) { mu.Lock(); dropped = append(dropped, ms...); mu.Unlock() },
		Done: func(m msg, ok bool) {
			mu.Lock()
			ended++
			if ok && m.key == "a2" && m.seq > 3 {
				t.Errorf("a2 %d finished after a2 3 was abandoned", m.seq)
			}
			mu.Unlock()
		},
	})
	for seq := 1; seq <= 6; seq++ {
		for _, k := range []string{"a1", "a2", "b1"} {
			d.Take(k, msg{k, seq})
		}
	}
	close(gate)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := ended + len(dropped)
		mu.Unlock()
		if n == 18 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 18 messages ended", n)
		}
	}
	if !d.Drain(5 * time.Second) {
		t.Fatal("drain timed out")
	}
	d.Close()
	last := map[string]int{}
	multi := 0
	for _, b := range batches {
		if len(b) > 1 {
			multi++
		}
		for _, m := range b {
			if m.key[:1] != b[0].key[:1] {
				t.Errorf("batch %v mixes groups", b)
			}
			if m.seq != last[m.key]+1 {
				t.Errorf("%s: seq %d after %d", m.key, m.seq, last[m.key])
			}
			last[m.key] = m.seq
		}
	}
	if multi == 0 {
		t.Errorf("no batch held more than one message: %v", batches)
	}
	if last["a1"] != 6 || last["b1"] != 6 {
		t.Errorf("last seqs %v, want a1 and b1 to reach 6", last)
	}
	t.Logf("%d batches, %d with more than one message, %d dropped", len(batches), multi, len(dropped))
}

// TestPerMessageOrderAndBound: one message of an aggregate at a time, in
// order, aggregates in parallel, at most MaxInFlight taken.
func TestPerMessageOrderAndBound(t *testing.T) {
	var mu sync.Mutex
	running := map[string]bool{}
	last := map[string]int{}
	parallel, maxParallel := 0, 0
	d := New(Config[msg]{
		MaxInFlight: 4,
		Process: func(m msg) bool {
			mu.Lock()
			if running[m.key] {
				t.Errorf("%s runs twice at once", m.key)
			}
			running[m.key] = true
			parallel++
			maxParallel = max(maxParallel, parallel)
			if m.seq != last[m.key]+1 {
				t.Errorf("%s: seq %d after %d", m.key, m.seq, last[m.key])
			}
			last[m.key] = m.seq
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			running[m.key] = false
			parallel--
			mu.Unlock()
			return true
		},
	})
	ctx := context.Background()
	for seq := 1; seq <= 20; seq++ {
		for k := range 3 {
			if d.Wait(ctx) == 0 {
				t.Fatal("no room")
			}
			d.Take(fmt.Sprint(k), msg{fmt.Sprint(k), seq})
		}
	}
	for deadline := time.Now().Add(5 * time.Second); d.Wait(ctx) < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the messages did not finish")
		}
	}
	if !d.Drain(5 * time.Second) {
		t.Fatal("drain timed out")
	}
	d.Close()
	if maxParallel < 2 || maxParallel > 3 {
		t.Errorf("at most %d ran at once, want 2 or 3 (3 aggregates)", maxParallel)
	}
	for k := range 3 {
		if last[fmt.Sprint(k)] != 20 {
			t.Errorf("aggregate %d ended at %d, want 20", k, last[fmt.Sprint(k)])
		}
	}
}
