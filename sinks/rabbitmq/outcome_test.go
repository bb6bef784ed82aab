package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/relay"
)

// ledger records the outcome the sink reported for every publish, by the
// publish's position in the test: message ids may repeat, positions do not.
type ledger struct {
	mu    sync.Mutex
	calls []int
	errs  []error
	total atomic.Int64
}

func newLedger(n int) *ledger {
	return &ledger{calls: make([]int, n), errs: make([]error, n)}
}

// done returns the done callback of publish i.
func (l *ledger) done(i int) func(*relay.Message, error) {
	return func(_ *relay.Message, err error) {
		l.mu.Lock()
		l.calls[i]++
		l.errs[i] = err
		l.mu.Unlock()
		l.total.Add(1)
	}
}

// wait waits until every publish has an outcome and checks that none has two.
func (l *ledger) wait(tb testing.TB, d time.Duration) {
	tb.Helper()
	n := len(l.calls)
	waitFor(tb, d, fmt.Sprintf("%d done calls", n), func() bool { return l.total.Load() >= int64(n) })
	time.Sleep(50 * time.Millisecond) // catch calls beyond n
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, c := range l.calls {
		if c != 1 {
			tb.Errorf("done called %d times for publish %d", c, i)
		}
	}
}

// arrivals counts the deliveries of every publish by its "seq" header and
// checks that first arrivals come in publish order.
func arrivals(tb testing.TB, got []amqp.Delivery, n int) []int {
	tb.Helper()
	count := make([]int, n)
	last := -1
	for _, d := range got {
		s, _ := d.Headers["seq"].(string)
		seq, err := strconv.Atoi(s)
		if err != nil || seq < 0 || seq >= n {
			tb.Fatalf("delivery with seq header %q is not one of the %d publishes", s, n)
		}
		if count[seq] == 0 {
			if seq <= last {
				tb.Errorf("publish %d arrived after publish %d", seq, last)
			}
			last = seq
		}
		count[seq]++
	}
	return count
}

// TestReturnSettlesThePublishItBelongsTo publishes pairs that share a
// message_id, the first routable and the second not. Each return must
// settle the unroutable publish of its pair: matched by message_id, the
// routable one would be reported unroutable and the unroutable one
// delivered, a lost message.
func TestReturnSettlesThePublishItBelongsTo(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "bound.*")
	s := startSink(t, Config{Exchange: f.exchange})

	const pairs = 200
	const n = 2 * pairs
	run := uniqueName(t)
	l := newLedger(n)
	for i := range n {
		typ := "bound"
		if i%2 == 1 {
			typ = "nobody"
		}
		m := testMessage(run, i, i, typ)
		m.ID = fmt.Sprintf("%s-%07d", run, i/2)
		s.Publish(context.Background(), m, l.done(i))
	}
	l.wait(t, 30*time.Second)
	got := consume(t, f.queue, pairs, 300*time.Millisecond, 20*time.Second)
	count := arrivals(t, got, n)

	var lost, wrongReturn, dups int
	for i := range n {
		err := l.errs[i]
		switch {
		case i%2 == 0 && err != nil:
			wrongReturn++
			if wrongReturn == 1 {
				t.Errorf("routable publish %d: done(%v), want nil", i, err)
			}
		case i%2 == 1 && err == nil:
			lost++
			if lost == 1 {
				t.Errorf("unroutable publish %d reported delivered", i)
			}
		case i%2 == 1 && (relay.Retryable(err) || !errors.Is(err, ErrUnroutable)):
			t.Errorf("unroutable publish %d: done(%v), want a permanent ErrUnroutable", i, err)
		}
		if i%2 == 0 && count[i] != 1 {
			t.Errorf("routable publish %d arrived %d times", i, count[i])
		}
		if count[i] > 1 {
			dups += count[i] - 1
		}
	}
	t.Logf("%d publishes in %d pairs: %d arrived, %d unroutable reported delivered (lost), %d routable reported unroutable, %d duplicates",
		n, pairs, len(got), lost, wrongReturn, dups)
	if lost+wrongReturn > 0 {
		t.Errorf("%d unroutable publishes reported delivered, %d routable ones reported unroutable", lost, wrongReturn)
	}
}

// limitedQueue declares a durable queue of at most max messages that nacks
// publishes beyond it, bound to the fixture's exchange for every key.
// Durable, because persisted messages are acked late, in batches, while
// rejected ones are nacked at once: confirms arrive out of order.
func limitedQueue(tb testing.TB, f *fixture, max int) string {
	tb.Helper()
	q := f.queue + "-limited"
	conn, ch := adminChannel(tb)
	defer conn.Close()
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": max, "x-overflow": "reject-publish"}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		conn, ch := adminChannel(tb)
		defer conn.Close()
		_, _ = ch.QueueDelete(q, false, false, false)
	})
	if err := ch.QueueBind(q, "#", f.exchange, false, nil); err != nil {
		tb.Fatal(err)
	}
	return q
}

// slowConsumer acknowledges one delivery of queue at a time, every pause.
type slowConsumer struct {
	mu   sync.Mutex
	got  []amqp.Delivery
	last time.Time
	stop context.CancelFunc
	done chan error
}

func startSlowConsumer(tb testing.TB, queue string, pause time.Duration) *slowConsumer {
	tb.Helper()
	conn, ch := adminChannel(tb)
	if err := ch.Qos(1, 0, false); err != nil {
		conn.Close()
		tb.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		conn.Close()
		tb.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &slowConsumer{last: time.Now(), stop: stop, done: make(chan error, 1)}
	go func() {
		defer conn.Close()
		for {
			select {
			case d, ok := <-deliveries:
				if !ok {
					c.done <- errors.New("consumer channel closed")
					return
				}
				time.Sleep(pause)
				if err := d.Ack(false); err != nil {
					c.done <- err
					return
				}
				c.mu.Lock()
				c.got = append(c.got, d)
				c.last = time.Now()
				c.mu.Unlock()
			case <-ctx.Done():
				c.done <- nil
				return
			}
		}
	}()
	tb.Cleanup(func() { c.stop() })
	return c
}

// drain waits until nothing arrived for idle, stops the consumer and
// returns what it received.
func (c *slowConsumer) drain(tb testing.TB, idle, timeout time.Duration) []amqp.Delivery {
	tb.Helper()
	waitFor(tb, timeout, "the queue to drain", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return time.Since(c.last) >= idle
	})
	c.stop()
	if err := <-c.done; err != nil {
		tb.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got
}

// TestRejectPublishNeverReportsALostMessageDelivered streams messages into a
// queue of 20 that rejects publishes beyond its length while a slow consumer
// drains it. Every publish must have arrived or have been reported nacked;
// one reported delivered that never arrived is lost for good, because the
// relay confirms past it.
func TestRejectPublishNeverReportsALostMessageDelivered(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t)
	q := limitedQueue(t, f, 20)
	c := startSlowConsumer(t, q, 100*time.Microsecond)
	s := startSink(t, Config{Exchange: f.exchange})

	// Bursts of 300 every 10ms against a consumer that takes about 0.1ms a
	// message: most of a burst is rejected, while the few publishes the
	// queue takes between rejections wait for their disk write, so nacks
	// overtake acks and the acks come in batches (multiple).
	const n, burst, gap = 6000, 300, 10 * time.Millisecond
	run := uniqueName(t)
	l := newLedger(n)
	for i := range n {
		if i%burst == 0 {
			time.Sleep(gap)
		}
		s.Publish(context.Background(), testMessage(run, i, 0, "order"), l.done(i))
	}
	l.wait(t, 60*time.Second)
	got := c.drain(t, time.Second, 60*time.Second)
	count := arrivals(t, got, n)

	var acked, nacked, lost, nackedArrived, dups int
	for i := range n {
		switch err := l.errs[i]; {
		case err == nil:
			acked++
			if count[i] == 0 {
				lost++
				if lost <= 3 {
					t.Errorf("publish %d reported delivered but never arrived", i)
				}
			}
		case errors.Is(err, ErrNacked) && relay.Retryable(err):
			nacked++
			if count[i] > 0 {
				nackedArrived++
			}
		default:
			t.Errorf("publish %d: done(%v), want nil or a retryable ErrNacked", i, err)
		}
		if count[i] > 1 {
			dups += count[i] - 1
		}
	}
	t.Logf("%d published: %d reported delivered, %d nacked; %d arrived, %d reported delivered but lost, %d nacked but arrived, %d duplicates",
		n, acked, nacked, len(got), lost, nackedArrived, dups)
	if lost > 0 {
		t.Errorf("%d of %d messages reported delivered never arrived", lost, n)
	}
	if dups > 0 {
		t.Errorf("%d duplicate deliveries", dups)
	}
	if nacked == 0 {
		t.Errorf("no publish was nacked: the queue never overflowed, the test proves nothing")
	}
}
