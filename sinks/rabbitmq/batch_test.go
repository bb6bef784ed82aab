package rabbitmq

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

func TestBatchConnWritesEverythingInOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	client, server := tcpPair(t)
	b := newBatchConn(client)
	// Writes of every size, some larger than the batch bound.
	var want bytes.Buffer
	for i := range 3000 {
		p := bytes.Repeat([]byte{byte(i)}, 1+i*37%3000+(i%500/499)*3*maxBatched)
		want.Write(p)
	}
	got := make(chan []byte, 1)
	go func() {
		all := make([]byte, want.Len())
		n, _ := io.ReadFull(server, all)
		got <- all[:n]
	}()
	for p := want.Bytes(); len(p) > 0; {
		n := 1 + len(p)*37%3000
		if len(p)%500 == 0 {
			n += 3 * maxBatched
		}
		n = min(n, len(p))
		if w, err := b.Write(p[:n]); w != n || err != nil {
			t.Fatalf("write: %d of %d, %v", w, n, err)
		}
		p = p[n:]
	}
	select {
	case all := <-got:
		if !bytes.Equal(all, want.Bytes()) {
			t.Fatalf("received %d bytes, want the %d written, in order", len(all), want.Len())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the bytes written did not all arrive")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBatchConnWriteErrorFailsReadsAndLaterWrites(t *testing.T) {
	defer goleak.VerifyNone(t)
	client, _ := tcpPair(t) // the peer stays, silent: only the write fails
	b := newBatchConn(client)
	if err := b.SetWriteDeadline(time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 1))
		readErr <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for err == nil {
		if time.Now().After(deadline) {
			t.Fatal("writes kept succeeding after the socket's writes failed")
		}
		_, err = b.Write(make([]byte, 1024))
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write returned %v, want the socket's error", err)
	}
	if _, again := b.Write([]byte{1}); again == nil {
		t.Fatal("a Write after the failure succeeded")
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("Read succeeded on a failed connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read still blocked after the write failed: amqp091's reader would never notice")
	}
	_ = b.Close()
}

func TestBatchConnCloseUnblocksAFullBuffer(t *testing.T) {
	defer goleak.VerifyNone(t)
	client, _ := tcpPair(t) // the peer never reads
	b := newBatchConn(client)
	written := make(chan error, 1)
	go func() {
		p := make([]byte, 64<<10)
		for {
			if _, err := b.Write(p); err != nil {
				written <- err
				return
			}
		}
	}()
	// The socket buffers fill, then the batch: Write must block, not grow.
	time.Sleep(200 * time.Millisecond)
	b.mu.Lock()
	n := len(b.buf)
	b.mu.Unlock()
	if n > 2*maxBatched {
		t.Fatalf("%d bytes buffered, over twice the bound %d", n, maxBatched)
	}
	select {
	case err := <-written:
		t.Fatalf("Write returned %v while the peer was not reading", err)
	default:
	}
	_ = b.Close()
	select {
	case err := <-written:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Write returned %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not unblock a waiting Write")
	}
}

// TestBatchConnCloseWritesWhatIsBuffered: bytes written just before Close
// (a TLS close_notify, amqp091's last frame) still reach the peer.
func TestBatchConnCloseWritesWhatIsBuffered(t *testing.T) {
	defer goleak.VerifyNone(t)
	client, server := tcpPair(t)
	b := newBatchConn(client)
	want := bytes.Repeat([]byte("last words "), 1000)
	for i := 0; i < len(want); i += 100 {
		if _, err := b.Write(want[i:min(i+100, len(want))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close returned %v, want net.ErrClosed", err)
	}
	_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(server)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the peer received %d bytes, want the %d written before Close", len(got), len(want))
	}
}
