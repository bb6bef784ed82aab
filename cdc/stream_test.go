package cdc

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fixedHandler is a Handler whose confirmed position only moves when the
// test moves it.
type fixedHandler struct{ pos atomic.Uint64 }

func (*fixedHandler) Begin(context.Context, Begin) error             { return nil }
func (*fixedHandler) Insert(context.Context, *Insert) error          { return nil }
func (*fixedHandler) Message(context.Context, *LogicalMessage) error { return nil }
func (*fixedHandler) Commit(context.Context, Commit) error           { return nil }
func (*fixedHandler) Start(context.Context, LSN) error               { return nil }
func (*fixedHandler) Idle(LSN, time.Time, bool)                      {}
func (*fixedHandler) Reset() bool                                    { return false }
func (h *fixedHandler) Confirmed() LSN                               { return LSN(h.pos.Load()) }
func (*fixedHandler) Drain(context.Context) error                    { return nil }
func (*fixedHandler) Unacknowledged() int                            { return 1 }
func (*fixedHandler) Room() <-chan struct{}                          { return nil }

// pipeConn returns a replication connection whose server side is a pipe the
// test reads: every standby status update the relay sends is passed to onStatus.
func pipeConn(t *testing.T, onStatus func()) *pgconn.PgConn {
	t.Helper()
	return pipeConnData(t, func([]byte) { onStatus() })
}

// pipeConnData is pipeConn that passes each status update's bytes.
func pipeConnData(t *testing.T, onStatus func(data []byte)) *pgconn.PgConn {
	t.Helper()
	client, server := net.Pipe()
	cfg, err := pgconn.ParseConfig("postgres://relay@127.0.0.1/db")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Config: cfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	go func() {
		be := pgproto3.NewBackend(server, server)
		for {
			msg, err := be.Receive()
			if err != nil {
				return
			}
			if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 0 && cd.Data[0] == 'r' {
				onStatus(cd.Data)
			}
		}
	}()
	return conn
}

// A stopping walsender (WalSndDone) asks for a new reply after every reply
// it gets, for as long as the flush position is short of what it sent. The
// relay must not answer that loop at network speed: it burnt the
// walsender's CPU and kept it from ever timing out.
func TestKeepaliveRepliesAreThrottled(t *testing.T) {
	h := &fixedHandler{}
	h.pos.Store(100)
	var sent atomic.Int64
	var st *statusWriter
	conn := pipeConn(t, func() {
		sent.Add(1)
		st.requestReply() // the walsender's next keepalive, reply requested
	})
	st = &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1), replyEvery: 1000}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		st.run(ctx, time.Hour, zap.NewNop())
	}()
	st.requestReply()
	const window = 2 * time.Second
	time.Sleep(window)
	cancel()
	<-done
	n := sent.Load()
	perSecond := float64(n) / window.Seconds()
	t.Logf("status updates in answer to reply requests: %d in %s (%.1f/s)", n, window, perSecond)
	// At most one reply per replyGap while the position stands still.
	if limit := int64(window/replyGap) + 2; n > limit {
		t.Fatalf("%d replies in %s to keepalives that asked for one with the position unchanged, want at most %d", n, window, limit)
	}
	if n < 2 {
		t.Fatalf("%d replies in %s: reply requests must still be answered, or wal_sender_timeout ends the connection", n, window)
	}
}

// Once the reader has heard nothing for a status interval, every status
// update asks the walsender for a reply, so that a live one is never silent
// for long and silence means a lost connection (Stream.StallAfter); while
// the reader hears from it, updates ask only every replyEvery ticks.
func TestSilentStreamAsksForReplies(t *testing.T) {
	const every = 20 * time.Millisecond
	for _, tc := range []struct {
		name   string
		silent time.Duration
		asks   bool
	}{{"hearing the walsender", 0, false}, {"silent for an interval", every, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var updates, asked atomic.Int64
			conn := pipeConnData(t, func(data []byte) {
				updates.Add(1)
				// 'r', write, flush, apply, client time (8 bytes each), reply requested
				if len(data) == 34 && data[33] == 1 {
					asked.Add(1)
				}
			})
			h := &fixedHandler{}
			st := &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1), replyEvery: 1000,
				silent: func() time.Duration { return tc.silent }}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				st.run(ctx, every, zap.NewNop())
			}()
			for updates.Load() < 10 {
				time.Sleep(every)
			}
			cancel()
			<-done
			n, a := updates.Load(), asked.Load()
			if tc.asks && a < n-1 {
				t.Fatalf("%d of %d status updates asked for a reply while the reader was silent, want all", a, n)
			}
			if !tc.asks && a != 0 {
				t.Fatalf("%d of %d status updates asked for a reply while the reader heard the walsender, want none", a, n)
			}
		})
	}
}

// A reply that reports a new position is not held back: a stopping
// walsender that can be answered in full must be answered at once.
func TestKeepaliveReplyWithNewPositionIsImmediate(t *testing.T) {
	h := &fixedHandler{}
	h.pos.Store(100)
	got := make(chan struct{}, 16)
	conn := pipeConn(t, func() { got <- struct{}{} })
	st := &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1), replyEvery: 1000}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.run(ctx, time.Hour, zap.NewNop())
	st.requestReply()
	<-got
	h.pos.Store(200)
	start := time.Now()
	st.requestReply()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no reply after the position moved")
	}
	if took := time.Since(start); took >= replyGap {
		t.Fatalf("reply with a new position took %s, held back like an unchanged one (gap %s)", took, replyGap)
	}
}

func TestWaitWatchNeedsRequestsInARow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	// A stopping walsender: a request after every reply, for longer than after.
	w := waitWatch{gap: time.Second, after: 3 * time.Second}
	for d := time.Duration(0); d < 3*time.Second; d += 250 * time.Millisecond {
		if w.observe(at(d), true) {
			t.Fatalf("gave up after %s, before %s of requests", d, w.after)
		}
	}
	if !w.observe(at(3*time.Second), true) {
		t.Fatal("3s of reply requests in a row while unable to confirm: not recognised")
	}

	// A live walsender's own requests, wal_sender_timeout/2 apart.
	w = waitWatch{gap: time.Second, after: 3 * time.Second}
	for d := time.Duration(0); d < time.Minute; d += 5 * time.Second {
		if w.observe(at(d), true) {
			t.Fatalf("requests 5s apart taken for a stopping walsender at %s", d)
		}
	}

	// Requests the relay can answer in full break the run.
	w = waitWatch{gap: time.Second, after: 3 * time.Second}
	for d := time.Duration(0); d < 10*time.Second; d += 250 * time.Millisecond {
		stuck := d%(2*time.Second) != 0
		if w.observe(at(d), stuck) {
			t.Fatalf("gave up at %s although the relay could confirm everything every 2s", d)
		}
	}
}

// TestStandbyLogsOnce: a standby polling every second logs that it waits
// once, then once every standbyRemind, not once a poll.
func TestStandbyLogsOnce(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	var l standbyLog
	start := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	for i := range 17 { // 17 polls in 13 s
		l.polled(log, "outboxrelay", time.Second, start.Add(time.Duration(i)*780*time.Millisecond), false)
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("17 polls in 13 s logged %d lines, want 1", n)
	}
	for i := range 600 { // ten more minutes at a poll a second
		l.polled(log, "outboxrelay", time.Second, start.Add(13*time.Second+time.Duration(i)*time.Second), false)
	}
	entries := logs.AllUntimed()
	if len(entries) != 3 || entries[1].Message != "still waiting as standby" {
		t.Fatalf("ten minutes of polls logged %d lines, want 3 (one, then one every 5 minutes): %v", len(entries), entries)
	}
}

// fullHandler is a Handler whose in-flight window is full and stays so:
// Room never has room, and a change handed over anyway waits, as the relay's
// window does, until the stream stops.
type fullHandler struct {
	fixedHandler
	room    chan struct{} // never closed
	changes atomic.Int64
	idle    atomic.Int64
}

func (h *fullHandler) Room() <-chan struct{}     { return h.room }
func (h *fullHandler) Idle(LSN, time.Time, bool) { h.idle.Add(1) }
func (h *fullHandler) wait(ctx context.Context) error {
	h.changes.Add(1)
	<-ctx.Done()
	return ctx.Err()
}
func (h *fullHandler) Begin(ctx context.Context, _ Begin) error    { return h.wait(ctx) }
func (h *fullHandler) Insert(ctx context.Context, _ *Insert) error { return h.wait(ctx) }
func (h *fullHandler) Commit(ctx context.Context, _ Commit) error  { return h.wait(ctx) }

// TestReadOnWhileHandlerFull: a walsender that has far more to send than a
// full Handler takes, and then asks for replies as a stopping one does
// (WalSndDone), is read to the end and answered by closing the session
// without confirming, and the Handler gets none of the changes. Before, the
// reader stopped at the full Handler, and the walsender stayed blocked
// writing, as PostgreSQL's shutdown did.
func TestReadOnWhileHandlerFull(t *testing.T) {
	client, server := net.Pipe() // unbuffered: a write returns only once the reader has read it
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	cfg, err := pgconn.ParseConfig("postgres://relay@127.0.0.1/db")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Config: cfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	s := &Stream{cfg: Config{}, log: zap.NewNop()}
	s.cfg = s.cfg.WithDefaults()
	h := &fullHandler{room: make(chan struct{})}
	st := &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1), replyEvery: 1}

	const rows = 2000
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		ins := msg{'I'}.u32(7).u8('N').u16(3).text("0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a").text(`"payload"`).u8('n')
		out := xlogData(nil, 1, relationMsg(7))
		out = xlogData(out, 2, msg{'B'}.u64(100).u64(0).u32(1))
		for i := range rows {
			out = xlogData(out, uint64(3+i), ins)
		}
		out = xlogData(out, 100, msg{'C'}.u8(0).u64(100).u64(101).u64(0))
		if _, err := server.Write(out); err != nil {
			return
		}
		sent <- struct{}{}
		// A stopping walsender: a reply request every 100 ms, the server
		// ahead of what the relay confirmed.
		ka := binary.BigEndian.AppendUint64([]byte{'k'}, 1<<20)
		ka = binary.BigEndian.AppendUint64(ka, 0)
		frame, _ := (&pgproto3.CopyData{Data: append(ka, 1)}).Encode(nil)
		for {
			if _, err := server.Write(frame); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	readErr := make(chan error, 1)
	go func() { readErr <- s.read(ctx, conn, h, st) }()

	select {
	case <-sent:
	case <-time.After(15 * time.Second):
		cancel()
		<-readErr
		t.Fatalf("the reader stopped reading while the Handler was full: %d changes of %d read in 15s", h.changes.Load(), rows+3)
	}
	select {
	case err := <-readErr:
		if !errors.Is(err, errCannotConfirm) {
			t.Fatalf("read ended with %v, want the session closed without confirming (%v)", err, errCannotConfirm)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the reader did not end the session within 15s of a stopping walsender's reply requests")
	}
	if n := h.changes.Load(); n != 0 {
		t.Fatalf("the full Handler was handed %d changes", n)
	}
	if n := h.idle.Load(); n != 0 {
		t.Fatalf("Idle was called %d times while changes were held or dropped", n)
	}
}
