package relay

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestTrackerWatermarkIsContiguous(t *testing.T) {
	tr := newTracker()
	tr.idle(100)
	if got := tr.Confirmed(); got != 100 {
		t.Fatalf("idle with nothing in flight: confirmed %v, want 100", got)
	}

	a := tr.begin()
	tr.add(a)
	tr.add(a)
	tr.commit(200)
	b := tr.begin()
	tr.add(b)
	tr.commit(300)
	c := tr.begin()
	tr.add(c)

	tr.ack(b) // later transaction first: must not move the watermark
	if got := tr.Confirmed(); got != 100 {
		t.Fatalf("after ack of b only: confirmed %v, want 100", got)
	}
	tr.ack(a)
	if got := tr.Confirmed(); got != 100 {
		t.Fatalf("a half acknowledged: confirmed %v, want 100", got)
	}
	tr.idle(1000) // inside open transaction c: ignored
	tr.ack(a)
	if got := tr.Confirmed(); got != 300 {
		t.Fatalf("a and b acknowledged: confirmed %v, want 300", got)
	}
	tr.ack(c) // c not committed yet
	if got := tr.Confirmed(); got != 300 {
		t.Fatalf("c acknowledged but open: confirmed %v, want 300", got)
	}
	tr.commit(400)
	if got := tr.Confirmed(); got != 400 {
		t.Fatalf("c committed: confirmed %v, want 400", got)
	}
}

func TestTrackerKeepaliveWaitsForInflight(t *testing.T) {
	tr := newTracker()
	a := tr.begin()
	tr.add(a)
	tr.commit(200)
	tr.idle(500) // a keepalive while a is in flight must not be confirmed yet
	tr.idle(600)
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("confirmed %v while a message is in flight", got)
	}
	tr.ack(a)
	if got := tr.Confirmed(); got != 600 {
		t.Fatalf("after ack: confirmed %v, want 600", got)
	}
}

func TestTrackerResetAbandonsOpenTransaction(t *testing.T) {
	tr := newTracker()
	a := tr.begin()
	tr.add(a)
	tr.reset() // connection lost mid-transaction: a is re-sent later in full
	b := tr.begin()
	tr.add(b)
	tr.commit(900)
	tr.ack(b)
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("confirmed %v past an unacknowledged message of the abandoned transaction", got)
	}
	tr.ack(a)
	if got := tr.Confirmed(); got != pglogrepl.LSN(900) {
		t.Fatalf("confirmed %v, want 900", got)
	}
	if n, _ := tr.inflight(); n != 0 {
		t.Fatalf("inflight %d, want 0", n)
	}
}

func TestTrackerFoldsEmptyTransactionsBehindAStuckOne(t *testing.T) {
	tr := newTracker()
	stuck := tr.begin()
	tr.add(stuck)
	tr.commit(100)
	for i := 0; i < 100000; i++ {
		tr.begin()
		tr.commit(pglogrepl.LSN(200 + i))
	}
	if n := len(tr.queue); n > 2 {
		t.Fatalf("%d tracker entries for 100000 empty transactions behind a stuck one; memory must stay bounded", n)
	}
	tr.ack(stuck)
	if got := tr.Confirmed(); got != pglogrepl.LSN(200+99999) {
		t.Fatalf("confirmed %v, want %v", got, pglogrepl.LSN(200+99999))
	}
}
