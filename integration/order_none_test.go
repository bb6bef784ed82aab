package integration

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestOrderNoneHotAggregate: with relay.order: none, the messages of one
// aggregate are handed to the sink together rather than one at a time.
// While kfake answers no produce request, the 20 rows of a single
// aggregate are all at the sink awaiting its answer at once (/readyz counts
// them: "20 messages waiting", where the per-aggregate gate shows 1); once
// it answers again, every row of the ledger arrives and none is
// dead-lettered.
func TestOrderNoneHotAggregate(t *testing.T) {
	e := newEnv(t)
	var silent atomic.Bool
	e.kafka.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		return nil, nil, silent.Load()
	})
	p := e.start("OUTBOXRELAY_RELAY_ORDER=none", "OUTBOXRELAY_RELAY_DEAD_LETTER_ORDER=pass")
	base := "http://" + p.httpAddr()
	p.waitLog(`"streaming"`, 30*time.Second)
	c := e.consume("outbox.order")
	ledger := e.insert("outbox", "order", "hot", 5) // creates the topic
	c.waitIDs(ledger, 30*time.Second)

	silent.Store(true)
	ledger = append(ledger, e.insert("outbox", "order", "hot", 20)...)
	var ready string
	waitFor(t, 20*time.Second, "20 messages of one aggregate at the sink", func() bool {
		var code int
		code, ready = get(t, base+"/readyz")
		return code == 503 && strings.Contains(ready, "(20 messages waiting)")
	})
	t.Logf("one aggregate, broker silent: %s", strings.TrimSpace(ready))
	silent.Store(false)

	got := c.waitIDs(ledger, 60*time.Second)
	seen := map[string]bool{}
	for _, r := range got {
		seen[r.Headers["message_id"]] = true
	}
	lost := 0
	for _, id := range ledger {
		if !seen[id] {
			lost++
		}
	}
	_, body := get(t, base+"/metrics")
	dead := sum(metricValues(body, "outboxrelay_dead_letters_total"))
	t.Logf("ledger %d rows, consumed %d records, lost %d, dead letters %v", len(ledger), len(got), lost, dead)
	if lost != 0 || dead != 0 {
		t.Fatalf("lost %d, dead letters %v, want 0 and 0", lost, dead)
	}
}
