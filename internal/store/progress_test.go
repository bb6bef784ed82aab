package store

import (
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/migrations"
	"github.com/outboxrelay/outboxrelay/relay"
)

// TestProgressLostReply: a progress write that commits while its reply is
// lost (a partition, a terminated session) is not counted again by the
// next write. The fault stands in for the partition: a TCP proxy between
// the pool and a real PostgreSQL drops the server's CommandComplete of the
// armed write, and everything after it, and closes the connection.
func TestProgressLostReply(t *testing.T) {
	ctx := t.Context()
	conn := connectT(t, "progress_lost_reply")
	if err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	// A total from an earlier run, which this run adds to.
	if _, err := conn.Exec(ctx, `INSERT INTO outboxrelay.checkpoint (slot, published_total) VALUES ('orders', 100)`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	p := startReplyDropper(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", p.port()
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	w := NewProgress(pool, "orders", nil)
	for i := range 3 {
		w.Published(&relay.Message{ID: string(rune('a' + i)), LSN: pglogrepl.LSN(0x100 * (i + 1))}, time.Now())
	}
	// Read the earlier total first, then lose the reply of the write.
	if err := w.Save(ctx); err != nil {
		t.Fatalf("first save: %v", err)
	}
	w.Published(&relay.Message{ID: "d", LSN: 0x400}, time.Now())
	w.Published(&relay.Message{ID: "e", LSN: 0x500}, time.Now())
	p.arm()
	if err := w.Save(ctx); err == nil {
		t.Fatal("save whose reply was dropped reported no error")
	}
	if p.dropped.Load() != 1 {
		t.Fatalf("the proxy dropped %d replies, want 1", p.dropped.Load())
	}
	var total int64
	if err := conn.QueryRow(ctx, `SELECT published_total FROM outboxrelay.checkpoint WHERE slot = 'orders'`).Scan(&total); err != nil || total != 105 {
		t.Fatalf("published_total after the lost reply = %d (%v), want 105: the write committed", total, err)
	}
	w.Published(&relay.Message{ID: "f", LSN: 0x600}, time.Now())
	if err := w.Save(ctx); err != nil {
		t.Fatalf("save after the lost reply: %v", err)
	}
	if err := conn.QueryRow(ctx, `SELECT published_total FROM outboxrelay.checkpoint WHERE slot = 'orders'`).Scan(&total); err != nil || total != 106 {
		t.Errorf("published_total = %d (%v), want 106: 100 before, 6 acknowledged once each", total, err)
	}
}

// replyDropper forwards PostgreSQL connections; once armed, it drops the
// next CommandComplete from the server and what follows, and closes that
// connection, so the client sees an error for a statement that committed.
type replyDropper struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped atomic.Int32
	wg      sync.WaitGroup
}

func startReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *replyDropper) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }
func (p *replyDropper) arm()         { p.armed.Store(true) }

func (p *replyDropper) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(server, client); server.Close() }()
		go func() { defer p.wg.Done(); p.serverToClient(server, client); client.Close() }()
	}
}

// serverToClient copies whole backend messages (the proxy's clients use
// sslmode=disable, so every server byte is in a typed message).
func (p *replyDropper) serverToClient(server, client net.Conn) {
	defer server.Close()
	head := make([]byte, 5)
	for {
		if _, err := io.ReadFull(server, head); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		if head[0] == 'C' && p.armed.CompareAndSwap(true, false) {
			p.dropped.Add(1)
			return
		}
		if _, err := client.Write(append(head, body...)); err != nil {
			return
		}
	}
}
