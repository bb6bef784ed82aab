package relay

import "testing"

// TestSpillAttackReadBackFailedPipedOrder: messages read back from the
// spill store are Messages rebuilt by the store (spill.go readBack), whose
// publish order (seq) is never set: every one is 0. When a pipelining sink
// (Kafka) reports three of an aggregate's read-back messages failed, in
// publish order, the oldest must be the one retried first (failedPiped),
// as for messages from the stream.
func TestSpillAttackReadBackFailedPipedOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		seqs [3]uint64
	}{
		{"from the stream", [3]uint64{7, 8, 9}},
		{"read back from the spill store", [3]uint64{0, 0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newAggregates()
			var ms []*Message
			for i, seq := range c.seqs {
				m := &Message{ID: string(rune('a' + i)), AggregateType: "order", AggregateID: "o1", seq: seq, spillSeq: int64(seq)}
				if seq == 0 {
					m.spillSeq = int64(100 + i)
				}
				if !a.admitPiped(m) {
					t.Fatalf("message %s not admitted", m.ID)
				}
				ms = append(ms, m)
			}
			var head *Message
			for _, m := range ms {
				head = a.failedPiped(m)
			}
			if head != ms[0] {
				t.Errorf("after %s, %s, %s failed in that order, %s is retried first; want %s, the oldest",
					ms[0].ID, ms[1].ID, ms[2].ID, head.ID, ms[0].ID)
			}
		})
	}
}
