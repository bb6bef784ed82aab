package rabbitmq

import (
	"net"
	"sync"
	"time"
)

const (
	// maxBatched bounds the bytes a batchConn holds for its socket: a Write
	// waits while that much is not yet written, as it would wait on a full
	// socket buffer.
	maxBatched = 64 << 10
	// closeFlush bounds how long Close tries to write what is buffered
	// (a TLS close_notify, say) before it closes the socket.
	closeFlush = time.Second
)

// batchConn is the connection the sink hands amqp091. amqp091 writes and
// flushes every publish on its own, one write system call each; batchConn
// takes those writes into a buffer and its own goroutine writes the buffer
// to the socket, so that the publishes written while one write is under
// way go out together in the next. A publish is never held back waiting
// for others: the writer starts as soon as there is something to write.
//
// A Write returns once its bytes are buffered. That changes nothing the
// sink relies on: a write the socket accepted could always fail to reach
// the broker, which is why only a publisher confirm counts. When the
// socket write fails, batchConn closes the socket, so that amqp091's
// reader fails and the session ends, and every later Write returns the
// error.
type batchConn struct {
	net.Conn

	mu      sync.Mutex
	cond    sync.Cond // signals buf filled, buf drained, or err set
	buf     []byte    // written, not handed to the socket yet
	err     error     // set once: the socket's write error, or net.ErrClosed after Close
	closing bool      // Close was called: the writer writes what is buffered and stops
	waiting bool      // the writer waits for buf to fill
	done    chan struct{}
}

// newBatchConn wraps c and starts its writer, which ends with Close or
// the first write error.
func newBatchConn(c net.Conn) *batchConn {
	b := &batchConn{Conn: c, done: make(chan struct{})}
	b.cond.L = &b.mu
	go b.write()
	return b
}

// Write buffers p for the writer. It waits while maxBatched bytes are not
// written yet, and fails once the connection failed or was closed.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.err == nil && !b.closing && len(b.buf) >= maxBatched {
		b.cond.Wait()
	}
	switch {
	case b.err != nil:
		return 0, b.err
	case b.closing:
		return 0, net.ErrClosed
	}
	b.buf = append(b.buf, p...)
	if b.waiting {
		b.waiting = false
		b.cond.Broadcast()
	}
	return len(p), nil
}

// write is the writer: it hands whatever is buffered to the socket in one
// write, again and again, until the connection fails, or is closed and
// nothing is left to write.
func (b *batchConn) write() {
	defer close(b.done)
	var out []byte
	for {
		b.mu.Lock()
		for b.err == nil && !b.closing && len(b.buf) == 0 {
			b.waiting = true
			b.cond.Wait()
		}
		if b.err != nil || len(b.buf) == 0 { // failed, or closing with nothing left
			b.mu.Unlock()
			return
		}
		full := len(b.buf) >= maxBatched
		out, b.buf = b.buf, out[:0]
		if full {
			b.cond.Broadcast() // room for a waiting Write
		}
		b.mu.Unlock()

		if _, err := b.Conn.Write(out); err != nil {
			b.fail(err)
			_ = b.Conn.Close() // amqp091's reader fails too
			return
		}
		if cap(out) > 4*maxBatched {
			out = nil // do not keep a buffer grown by a large message
		}
	}
}

func (b *batchConn) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = err
	}
	b.buf = nil
	b.cond.Broadcast()
}

// Close writes what is buffered, for at most closeFlush, closes the
// socket and returns once the writer has stopped. Later Writes fail with
// net.ErrClosed.
func (b *batchConn) Close() error {
	b.mu.Lock()
	b.closing = true
	b.cond.Broadcast()
	b.mu.Unlock()
	_ = b.Conn.SetWriteDeadline(time.Now().Add(closeFlush))
	<-b.done
	b.fail(net.ErrClosed)
	return b.Conn.Close()
}
