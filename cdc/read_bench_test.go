package cdc

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
)

// countHandler counts inserts and cancels the read loop after the last one.
type countHandler struct {
	fixedHandler
	n, want int
	cancel  context.CancelFunc
}

func (h *countHandler) Insert(context.Context, *Insert) error {
	if h.n++; h.n == h.want {
		h.cancel()
	}
	return nil
}

// xlogData wraps a pgoutput message as the walsender sends it.
func xlogData(dst []byte, lsn uint64, m msg) []byte {
	body := binary.BigEndian.AppendUint64([]byte{'w'}, lsn)
	body = binary.BigEndian.AppendUint64(body, lsn)
	body = binary.BigEndian.AppendUint64(body, 0)
	body = append(body, m...)
	out, err := (&pgproto3.CopyData{Data: body}).Encode(dst)
	if err != nil {
		panic(err)
	}
	return out
}

// BenchmarkReadLoop measures the replication read loop's own cost per row:
// a walsender on loopback TCP sends transactions of 100 inserts of 1 KB as
// fast as the loop reads them, and the handler discards them. The server's
// work is a single Write of a prepared block per transaction.
func BenchmarkReadLoop(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	const perTx = 100
	payload := make([]byte, 1022)
	for i := range payload {
		payload[i] = 'a'
	}
	ins := msg{'I'}.u32(7).u8('N').u16(3).text("0193a5b0-7d4e-7c1a-9f3e-2b8c1d0e4f5a").text(`"` + string(payload) + `"`).u8('n')
	tx := xlogData(nil, 1, msg{'B'}.u64(100).u64(0).u32(1))
	for i := range perTx {
		tx = xlogData(tx, uint64(2+i), ins)
	}
	tx = xlogData(tx, 100, msg{'C'}.u8(0).u64(100).u64(101).u64(0))
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := c.Write(xlogData(nil, 1, relationMsg(7))); err != nil {
			return
		}
		for {
			if _, err := c.Write(tx); err != nil {
				return
			}
		}
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	cfg, err := pgconn.ParseConfig("postgres://relay@127.0.0.1/db")
	if err != nil {
		b.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Config: cfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		b.Fatal(err)
	}
	s := &Stream{cfg: Config{}}
	s.cfg = s.cfg.WithDefaults()
	st := &statusWriter{conn: conn, reply: make(chan struct{}, 1), replyEvery: 1}
	ctx, cancel := context.WithCancel(context.Background())
	h := &countHandler{want: b.N, cancel: cancel}
	st.h = h
	b.SetBytes(int64(len(ins)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	// As Run hands changes over: through handover.
	if err := s.read(ctx, conn, &handover{Handler: h}, st); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if h.n < b.N {
		b.Fatalf("read %d of %d rows in %s", h.n, b.N, time.Since(start))
	}
}

// silentServer accepts one replication connection, sends n keepalives
// every gap and then nothing more, keeping the connection open.
func silentServer(t *testing.T, n int, gap time.Duration) (*pgconn.PgConn, <-chan time.Time) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	last := make(chan time.Time, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		ka := []byte{'k', 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		frame, _ := (&pgproto3.CopyData{Data: ka}).Encode(nil)
		var at time.Time
		for range n {
			time.Sleep(gap)
			if _, err := c.Write(frame); err != nil {
				return
			}
			at = time.Now()
		}
		last <- at
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	cfg, err := pgconn.ParseConfig("postgres://relay@127.0.0.1/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: client, Config: cfg, ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	return conn, last
}

// The read deadline moves only now and then; a walsender that goes silent
// must still end the session, and not before ReceiveTimeout has passed
// since its last message.
func TestReadEndsAfterReceiveTimeoutOfSilence(t *testing.T) {
	const timeout = 400 * time.Millisecond
	conn, last := silentServer(t, 12, 60*time.Millisecond) // 720 ms of traffic: past the first deadline
	s := &Stream{cfg: Config{ReceiveTimeout: timeout}}
	s.cfg = s.cfg.WithDefaults()
	h := &fixedHandler{}
	st := &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1), replyEvery: 1}
	err := s.read(t.Context(), conn, h, st)
	ended := time.Now()
	var re retryableErr
	if !errors.As(err, &re) {
		t.Fatalf("read ended with %v, want the receive timeout (retryable)", err)
	}
	silent := ended.Sub(<-last)
	if silent < timeout {
		t.Fatalf("session ended %s after the last message, before the receive timeout of %s", silent, timeout)
	}
	if limit := timeout + timeout/8 + 2*time.Second; silent > limit {
		t.Fatalf("session ended %s after the last message, want about %s", silent, timeout+timeout/8)
	}
}

// Cancelling ctx ends a receive blocked on a silent walsender at once,
// without waiting for the receive timeout.
func TestReadEndsOnCancel(t *testing.T) {
	conn, _ := silentServer(t, 1, 0)
	s := &Stream{cfg: Config{ReceiveTimeout: time.Minute}}
	s.cfg = s.cfg.WithDefaults()
	h := &fixedHandler{}
	st := &statusWriter{conn: conn, h: h, reply: make(chan struct{}, 1), replyEvery: 1}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	done := make(chan error, 1)
	go func() { done <- s.read(ctx, conn, h, st) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read after cancel: %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("read still blocked 20 s after its context was cancelled")
	}
}
