package relay

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestTrackerWatermarkIsContiguous(t *testing.T) {
	tr := newTracker()
	tr.idle(100, time.Time{})
	if got := tr.Confirmed(); got != 100 {
		t.Fatalf("idle with nothing in flight: confirmed %v, want 100", got)
	}

	a := tr.begin()
	tr.add(a, 0)
	tr.add(a, 0)
	tr.commit(200)
	b := tr.begin()
	tr.add(b, 0)
	tr.commit(300)
	c := tr.begin()
	tr.add(c, 0)

	tr.ack(b, 0) // later transaction first: must not move the watermark
	if got := tr.Confirmed(); got != 100 {
		t.Fatalf("after ack of b only: confirmed %v, want 100", got)
	}
	tr.ack(a, 0)
	if got := tr.Confirmed(); got != 100 {
		t.Fatalf("a half acknowledged: confirmed %v, want 100", got)
	}
	tr.idle(1000, time.Time{}) // inside open transaction c: ignored
	tr.ack(a, 0)
	if got := tr.Confirmed(); got != 300 {
		t.Fatalf("a and b acknowledged: confirmed %v, want 300", got)
	}
	tr.ack(c, 0) // c not committed yet
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
	tr.add(a, 0)
	tr.commit(200)
	tr.idle(500, time.Time{}) // a keepalive while a is in flight must not be confirmed yet
	tr.idle(600, time.Time{})
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("confirmed %v while a message is in flight", got)
	}
	tr.ack(a, 0)
	if got := tr.Confirmed(); got != 600 {
		t.Fatalf("after ack: confirmed %v, want 600", got)
	}
}

func TestTrackerResetAbandonsOpenTransaction(t *testing.T) {
	tr := newTracker()
	a := tr.begin()
	tr.add(a, 0)
	tr.reset() // connection lost mid-transaction: a comes again later
	b := tr.begin()
	tr.add(b, 0)
	tr.commit(900)
	tr.ack(b, 0)
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("confirmed %v past an unacknowledged message of the abandoned transaction", got)
	}
	tr.ack(a, 0)
	if got := tr.Confirmed(); got != pglogrepl.LSN(900) {
		t.Fatalf("confirmed %v, want 900", got)
	}
	if n, _ := tr.inFlight(); n != 0 {
		t.Fatalf("inflight %d, want 0", n)
	}
}

// A transaction delivered again after a reset brings only the changes the
// stream had not handed over (cdc.Handler.Reset): its end is confirmed once
// the messages of both parts, on every sink, are acknowledged.
func TestTrackerResumedTransactionWaitsForItsFirstPart(t *testing.T) {
	tr := newSinksTracker(2)
	first := tr.begin()
	tr.add(first, 0)
	tr.add(first, 1)
	tr.add(first, 0)
	tr.reset()
	rest := tr.begin()
	tr.add(rest, 0)
	tr.add(rest, 1)
	tr.commit(900)
	tr.ack(rest, 0)
	tr.ack(rest, 1)
	tr.ack(first, 0)
	tr.ack(first, 1)
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("confirmed %v with a message of the transaction's first part unacknowledged", got)
	}
	if got, _ := tr.sinkProgress(1); got != 900 {
		t.Fatalf("sink 1 acknowledged both parts: its progress is %v, want 900", got)
	}
	tr.ack(first, 0)
	if got := tr.Confirmed(); got != 900 {
		t.Fatalf("both parts acknowledged: confirmed %v, want 900", got)
	}
	if n, _ := tr.inFlight(); n != 0 {
		t.Fatalf("inflight %d, want 0", n)
	}
}

func TestTrackerFoldsEmptyTransactionsBehindAStuckOne(t *testing.T) {
	tr := newTracker()
	stuck := tr.begin()
	tr.add(stuck, 0)
	tr.commit(100)
	for i := 0; i < 100000; i++ {
		tr.begin()
		tr.commit(pglogrepl.LSN(200 + i))
	}
	if n := len(tr.queue); n > 2 {
		t.Fatalf("%d tracker entries for 100000 empty transactions behind a stuck one; memory must stay bounded", n)
	}
	tr.ack(stuck, 0)
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
	tr.add(a, 0)
	tr.commit(200)
	b := tr.beginAt(at(7))
	tr.add(b, 0)
	tr.commit(300)
	if got := tr.lagSince(); !got.Equal(at(5)) {
		t.Fatalf("a and b pending: lag since %v, want a's commit %v", got, at(5))
	}
	tr.ack(b, 0) // out of order: a is still the oldest unacknowledged
	if got := tr.lagSince(); !got.Equal(at(5)) {
		t.Fatalf("a pending: lag since %v, want a's commit %v", got, at(5))
	}
	c := tr.beginAt(at(9)) // still being received
	if got := tr.lagSince(); !got.Equal(at(5)) {
		t.Fatalf("a pending, c open: lag since %v, want %v", got, at(5))
	}
	tr.ack(a, 0)
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("c open: lag since %v, want c's commit %v", got, at(9))
	}
	tr.add(c, 0)
	tr.commit(400)
	tr.ack(c, 0)
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("nothing pending: lag since %v, want the newest commit %v", got, at(9))
	}
	d := tr.beginAt(at(12))
	tr.add(d, 0)
	tr.reset() // the session ended: d comes again, its message is still in flight
	tr.ack(d, 0)
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("after an abandoned transaction: lag since %v, want %v", got, at(9))
	}
}

// TestTrackerLagSinceKeepalive: with nothing pending, a keepalive between
// transactions says the relay was caught up when the server sent it, so
// lag counts from then, not from the last heartbeat's commit; a keepalive
// while messages are pending changes nothing until they are acknowledged.
func TestTrackerLagSinceKeepalive(t *testing.T) {
	tr := newTracker()
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tr.beginAt(at(0)) // a heartbeat
	tr.commit(100)
	tr.idle(100, at(9))
	if got := tr.lagSince(); !got.Equal(at(9)) {
		t.Fatalf("idle after a heartbeat: lag since %v, want the keepalive's %v", got, at(9))
	}
	a := tr.beginAt(at(10))
	tr.add(a, 0)
	tr.commit(200)
	tr.idle(200, at(15))
	if got := tr.lagSince(); !got.Equal(at(10)) {
		t.Fatalf("a pending: lag since %v, want a's commit %v", got, at(10))
	}
	tr.ack(a, 0)
	if got := tr.lagSince(); !got.Equal(at(15)) {
		t.Fatalf("a acknowledged: lag since %v, want the keepalive's %v", got, at(15))
	}
	tr.idle(200, time.Time{}) // a position without a time (the session's start)
	if got := tr.lagSince(); !got.Equal(at(15)) {
		t.Fatalf("after a keepalive without a time: lag since %v, want %v", got, at(15))
	}
}

// TestTrackerSinkProgress: with two sinks, each sink's own watermark
// passes the transactions whose messages of that sink are settled, while
// the confirmed position waits for the slower sink.
func TestTrackerSinkProgress(t *testing.T) {
	tr := newSinksTracker(2)
	a := tr.beginAt(time.Unix(100, 0))
	tr.add(a, 0)
	tr.add(a, 1)
	tr.commit(10)
	b := tr.beginAt(time.Unix(200, 0))
	tr.add(b, 0)
	tr.commit(20)

	tr.ack(a, 0)
	tr.ack(b, 0)
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("confirmed %s while sink 1 holds a message of the first transaction", got)
	}
	fast, fastSince := tr.sinkProgress(0)
	slow, slowSince := tr.sinkProgress(1)
	if fast != 20 || slow != 0 {
		t.Fatalf("sink watermarks %s and %s, want 0/14 and 0/0", fast, slow)
	}
	if !slowSince.Equal(time.Unix(100, 0)) || !fastSince.Equal(time.Unix(200, 0)) {
		t.Fatalf("lag since %v (slow) and %v (fast), want the first and the second commit", slowSince, fastSince)
	}
	tr.ack(a, 1)
	if got := tr.Confirmed(); got != 20 {
		t.Fatalf("confirmed %s once every sink settled, want 0/14", got)
	}
	if slow, _ := tr.sinkProgress(1); slow != 20 {
		t.Fatalf("sink 1 watermark %s, want 0/14", slow)
	}
}

// TestTrackerCarried: keepalives and transactions that brought nothing move
// the watermark but not the carried position; a transaction with messages,
// or with changes that hold nothing in flight, moves both once passed, also
// when empty ones were folded into it.
func TestTrackerCarried(t *testing.T) {
	tr := newTracker()
	tr.idle(100, time.Time{})
	tr.begin()
	tr.commit(200)
	if got, d := tr.Confirmed(), tr.Carried(); got != 200 || d != 0 {
		t.Fatalf("keepalive and empty transaction: confirmed %v carried %v, want 200 and 0", got, d)
	}
	a := tr.begin()
	tr.add(a, 0)
	tr.commit(300)
	if d := tr.Carried(); d != 0 {
		t.Fatalf("carried %v while a is in flight", d)
	}
	tr.ack(a, 0)
	if d := tr.Carried(); d != 300 {
		t.Fatalf("carried %v, want 300", d)
	}
	tr.idle(400, time.Time{})
	if got, d := tr.Confirmed(), tr.Carried(); got != 400 || d != 300 {
		t.Fatalf("confirmed %v carried %v, want 400 and 300", got, d)
	}

	stuck := tr.begin()
	tr.add(stuck, 0)
	tr.commit(500)
	b := tr.begin()
	tr.add(b, 0)
	tr.commit(600)
	tr.ack(b, 0)
	c := tr.begin()
	tr.add(c, 0)
	tr.ack(c, 0)
	tr.commit(700) // acknowledged before its commit: folded into b
	tr.ack(stuck, 0)
	if got, d := tr.Confirmed(), tr.Carried(); got != 700 || d != 700 {
		t.Fatalf("confirmed %v carried %v, want 700 and 700", got, d)
	}
	filtered := tr.begin()
	tr.carry(filtered)
	tr.commit(800)
	if d := tr.Carried(); d != 800 {
		t.Fatalf("carried %v after a transaction whose rows were filtered, want 800", d)
	}
}
