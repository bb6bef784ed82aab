package integration

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// largestBatch returns the most records in one partition's batch of a
// produce request.
func largestBatch(req kmsg.Request) int32 {
	pr, ok := req.(*kmsg.ProduceRequest)
	if !ok {
		return 0
	}
	var n int32
	for _, t := range pr.Topics {
		for _, p := range t.Partitions {
			var b kmsg.RecordBatch
			if b.ReadFrom(p.Records) == nil {
				n = max(n, b.NumRecords)
			}
		}
	}
	return n
}

// TestPipelinedHotAggregateRecordFailure: the Kafka sink pipelines a hot
// aggregate (several of its records in one produce batch), and kfake
// refuses such a batch for good (INVALID_RECORD) twice in the middle of the
// stream:
//   - once: the batch's first record is retried and delivered, the ones
//     behind it are held and follow it;
//   - then twice in a row: the first record fails both attempts
//     (relay.max_attempts 2) and becomes a dead letter that parks the
//     aggregate, and every later row of it is parked behind it, in commit
//     order, none published.
//
// Checked against the ledger of committed rows: every row before the dead
// letter arrives, first deliveries in commit order, and nothing else arrives.
func TestPipelinedHotAggregateRecordFailure(t *testing.T) {
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_RELAY_MAX_ATTEMPTS=2")
	p.waitLog(`"streaming"`, 30*time.Second)
	c.waitIDs(e.insert("outbox", "order", "hot", 4), 30*time.Second) // creates the topic

	var widest atomic.Int32
	observe := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1, When: func(req kmsg.Request) bool {
		if n := largestBatch(req); n > widest.Load() {
			widest.Store(n)
		}
		return false
	}})
	defer observe.Remove()

	var mu sync.Mutex
	var ledger []string // commit order: one writer, one aggregate
	stop := make(chan struct{})
	written := make(chan struct{})
	go func() {
		defer close(written)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ids := e.insertRetry("outbox", "order", "hot", 5)
			mu.Lock()
			ledger = append(ledger, ids...)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// A batch of at least two records of the aggregate, refused: mid-stream,
	// records behind the failed one.
	refuse := func(count int) *kfake.FaultHandle {
		var hits atomic.Int32 // the first hit needs a batch of two; the retry of its first record is alone
		return e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.order", Err: kerr.InvalidRecord, Count: count,
			When: func(req kmsg.Request) bool {
				if hits.Load() == 0 && largestBatch(req) < 2 {
					return false
				}
				hits.Add(1)
				return true
			},
		})
	}
	time.Sleep(2 * time.Second)
	once := refuse(1)
	waitFor(t, 30*time.Second, "a batch refused once", func() bool { return once.Hits() == 1 })
	time.Sleep(2 * time.Second)
	twice := refuse(2)
	waitFor(t, 30*time.Second, "a record refused twice", func() bool { return twice.Hits() == 2 })
	time.Sleep(time.Second)
	close(stop)
	<-written
	t.Logf("largest batch of one partition seen: %d records", widest.Load())
	if widest.Load() < 2 {
		t.Fatalf("no produce batch held two records of the hot aggregate: nothing was pipelined")
	}

	// The dead letter heads the aggregate, and the rows after it are parked.
	letters := e.dlqList()
	if len(letters) != 1 || !letters[0].Parks {
		t.Fatalf("want one dead letter parking the aggregate, have %+v", letters)
	}
	head := slices.Index(ledger, letters[0].MessageID)
	if head < 0 {
		t.Fatalf("dead letter %s is not a row of the ledger", letters[0].MessageID)
	}
	e.waitParked(ledger[head+1:])
	delivered := ledger[:head]
	recs := c.waitIDs(delivered, 60*time.Second)
	time.Sleep(time.Second)
	notArrived(t, c, ledger[head:])
	p.stop()

	pos := map[string]int{}
	for i, id := range ledger {
		pos[id] = i
	}
	seen := map[string]bool{}
	prev, disorders := -1, 0
	for _, r := range recs {
		id := r.Headers["message_id"]
		i, ok := pos[id]
		if !ok || seen[id] {
			continue // warm-up rows and later copies
		}
		seen[id] = true
		if i < prev {
			if disorders++; disorders <= 5 {
				t.Errorf("first delivery of row %d of the ledger after row %d", i, prev)
			}
		}
		prev = max(prev, i)
	}
	if disorders > 0 {
		t.Errorf("%d rows delivered first after a row committed later", disorders)
	}
	t.Logf("pipelined hot aggregate, record refused once then twice: rows %d, delivered %d, lost 0, dead letter at row %d, parked %d, out of order %d, duplicates %d",
		len(ledger), len(delivered), head, len(ledger)-head-1, disorders, duplicates(recs))
}
