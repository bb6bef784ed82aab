package relay

import (
	"testing"
	"time"

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

func TestTrackerKeepaliveWaitsForInFlight(t *testing.T) {
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
	if n, _ := tr.inFlight(); n != 0 {
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

func TestTrackerLagSince(t *testing.T) {
	tr := newTracker()
	if got := tr.lagSince(); !got.IsZero() {
		t.Fatalf("before any transaction: lag since %v, want zero", got)
	}
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	hb := tr.beginAt(at(0)) // a heartbeat: no messages
	_ = hb
	tr.commit(100)
	if got := tr.lagSince(); !got.Equal(at(0)) {
		t.Fatalf("after a heartbeat: lag since %v, want its commit %v", got, at(0))
	}
	a := tr.beginAt(at(5))
	tr.add(a)
	tr.commit(200)
	b := tr.beginAt(at(7))
	tr.add(b)
	tr.commit(300)
	if got := tr.lagSince(); !got.Equal(at(5)) {
		t.Fatalf("a and b pending: lag since %v, want a's commit %v", got, at(5))
	}
	tr.ack(b) // out of order: a is still the oldest unacknowledged
	if got := tr.lagSince(); !got.Equal(at(5)) {
		t.Fatalf("a pending: lag since %v, want a's commit %v", got, at(5))
	}
	c := tr.beginAt(at(9)) // still being received
	if got := tr.lagSince(); !got.Equal(at(5)) {
		t.Fatalf("a pending, c open: lag since %v, want %v", got, at(5))
	}
	tr.ack(a)
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("c open: lag since %v, want c's commit %v", got, at(9))
	}
	tr.add(c)
	tr.commit(400)
	tr.ack(c)
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("nothing pending: lag since %v, want the newest commit %v", got, at(9))
	}
	d := tr.beginAt(at(12))
	tr.add(d)
	tr.reset() // the session ended: d comes again, its message is still in flight
	tr.ack(d)
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("after an abandoned transaction: lag since %v, want %v", got, at(9))
	}
}
