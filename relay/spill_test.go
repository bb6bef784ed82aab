package relay

import (
	"sync/atomic"
	"testing"
)

// TestSpillReadBackFailedPipedOrder: messages read back from the spill
// store are rebuilt by the store, without a publish order (seq). The
// sink's queue numbers them as they enter it (publisher.enqueue), so that
// when a pipelining sink (Kafka) reports three of an aggregate's read-back
// messages failed, in publish order, the oldest is the one retried first
// (failedPiped), as for messages from the stream. Before enqueue numbered
// them, every one had seq 0 and the newest was retried first.
func TestSpillReadBackFailedPipedOrder(t *testing.T) {
	p := &publisher{queue: make(chan *Message, 3), seq: new(atomic.Uint64), queuedOnes: map[*Message]struct{}{}}
	p.seq.Store(41) // the stream's messages came first
	a := newAggregates()
	var ms []*Message
	for i := range 3 {
		m := &Message{ID: string(rune('a' + i)), AggregateType: "order", AggregateID: "o1", spillSeq: int64(100 + i)}
		if !p.enqueue(t.Context(), m) {
			t.Fatal("enqueue refused")
		}
		if !a.admitPiped(<-p.queue) {
			t.Fatalf("message %s not admitted", m.ID)
		}
		ms = append(ms, m)
	}
	var head *Message
	for _, m := range ms {
		head = a.failedPiped(m)
	}
	if head != ms[0] {
		t.Errorf("after %s, %s, %s failed in that order, %s is retried first; want %s, the oldest (seqs %d, %d, %d)",
			ms[0].ID, ms[1].ID, ms[2].ID, head.ID, ms[0].ID, ms[0].seq, ms[1].seq, ms[2].seq)
	}
}
