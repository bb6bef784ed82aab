package relay

import (
	"context"
	"sync"
)

// window bounds the messages and bytes in flight. acquire blocks while the
// window is full; release frees room. A single message larger than the byte
// limit is let through when nothing else is in flight, so it cannot deadlock.
// The handler acquires on the stream goroutine; publisher.complete releases
// from whichever goroutine settles the message.
type window struct {
	mu       sync.Mutex
	maxMsgs  int
	maxBytes int64
	msgs     int
	bytes    int64
	waiting  bool
	room     chan struct{} // closed and replaced when room is freed for a waiter
	// largest is the largest size acquired so far: room expects the next
	// message to be no larger.
	largest int64
}

func newWindow(maxMsgs int, maxBytes int64) *window {
	return &window{maxMsgs: maxMsgs, maxBytes: maxBytes, room: make(chan struct{})}
}

func (w *window) acquire(ctx context.Context, size int) error {
	for {
		w.mu.Lock()
		if w.msgs == 0 || (w.msgs < w.maxMsgs && w.bytes+int64(size) <= w.maxBytes) {
			w.msgs++
			w.bytes += int64(size)
			w.largest = max(w.largest, int64(size))
			w.mu.Unlock()
			return nil
		}
		room := w.room
		w.waiting = true
		w.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// full returns nil when a message as large as the largest so far would be
// let in now, else a channel closed when room is next freed.
func (w *window) full() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.msgs == 0 || (w.msgs < w.maxMsgs && w.bytes+w.largest <= w.maxBytes) {
		return nil
	}
	w.waiting = true
	return w.room
}

func (w *window) release(size int) {
	w.mu.Lock()
	w.msgs--
	w.bytes -= int64(size)
	if w.waiting {
		w.waiting = false
		close(w.room)
		w.room = make(chan struct{})
	}
	w.mu.Unlock()
}

func (w *window) inFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.msgs
}
