package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// The broker the tests use: RabbitMQ on loopback with the default user.
const (
	brokerAddr = "127.0.0.1:5672"
	brokerURL  = "amqp://guest:guest@" + brokerAddr + "/"
)

// needBroker skips the test when RabbitMQ does not answer, and fails it on
// CI, where a missing broker is a broken setup.
func needBroker(tb testing.TB) {
	tb.Helper()
	c, err := net.DialTimeout("tcp", brokerAddr, time.Second)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("RabbitMQ is not reachable on %s: %v", brokerAddr, err)
		}
		tb.Skipf("RabbitMQ is not reachable on %s: %v", brokerAddr, err)
	}
	c.Close()
}

// verifyNoLeaks checks for leaked goroutines after every cleanup of the
// test, including the fixture's connections.
func verifyNoLeaks(tb testing.TB) {
	tb.Cleanup(func() { goleak.VerifyNone(tb) })
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9]+`)

func uniqueName(tb testing.TB) string {
	return fmt.Sprintf("outboxrelay-test-%s-%d", nonName.ReplaceAllString(tb.Name(), "-"), time.Now().UnixNano())
}

// fixture is a durable topic exchange with one durable queue bound to it,
// both deleted when the test ends.
type fixture struct {
	exchange, queue string
}

func newFixture(tb testing.TB, bindings ...string) *fixture {
	tb.Helper()
	f := &fixture{exchange: uniqueName(tb), queue: uniqueName(tb) + "-q"}
	conn, ch := adminChannel(tb)
	defer conn.Close()
	if err := ch.ExchangeDeclare(f.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		tb.Fatal(err)
	}
	if _, err := ch.QueueDeclare(f.queue, true, false, false, false, nil); err != nil {
		tb.Fatal(err)
	}
	for _, b := range bindings {
		if err := ch.QueueBind(f.queue, b, f.exchange, false, nil); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		conn, ch := adminChannel(tb)
		defer conn.Close()
		_, _ = ch.QueueDelete(f.queue, false, false, false)
		_ = ch.ExchangeDelete(f.exchange, false, false)
	})
	return f
}

func adminChannel(tb testing.TB) (*amqp.Connection, *amqp.Channel) {
	tb.Helper()
	conn, err := amqp.Dial(brokerURL)
	if err != nil {
		tb.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		tb.Fatal(err)
	}
	return conn, ch
}

// startSink connects a sink and runs it until the test ends.
func startSink(tb testing.TB, cfg Config) *Sink {
	tb.Helper()
	if cfg.URL == "" {
		cfg.URL = brokerURL
	}
	s, err := New(cfg, zaptest.NewLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Connect(context.Background()); err != nil {
		tb.Fatal(err)
	}
	sinktest.RunSink(tb, s)
	waitFor(tb, 10*time.Second, "sink ready", s.Ready)
	return s
}

func waitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testMessage is message seq of aggregate agg.
func testMessage(run string, seq, agg int, aggType string) *relay.Message {
	id := fmt.Sprintf("%s-%07d", run, seq)
	return &relay.Message{
		ID:            id,
		AggregateType: aggType,
		AggregateID:   strconv.Itoa(agg),
		EventType:     "order.created",
		Table:         "public.outbox",
		Traceparent:   fmt.Sprintf("00-%032x-%016x-01", seq+1, seq+1),
		Headers:       []envelope.Header{{Key: "tenant", Value: "acme"}, {Key: "seq", Value: strconv.Itoa(seq)}},
		Envelope:      fmt.Appendf(nil, `{"envelope_version":1,"message_id":%q,"payload":{"seq":%d}}`, id, seq),
		CommitTime:    time.Date(2026, 11, 29, 8, 0, 0, 123456000, time.UTC).Add(time.Duration(seq) * time.Second),
	}
}

// recorder counts done calls per message.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	errs  map[string]error
	total atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{calls: map[string]int{}, errs: map[string]error{}}
}

func (r *recorder) done(m *relay.Message, err error) {
	r.mu.Lock()
	r.calls[m.ID]++
	if err != nil {
		r.errs[m.ID] = err
	}
	r.mu.Unlock()
	r.total.Add(1)
}

func (r *recorder) wait(tb testing.TB, n int, d time.Duration) {
	tb.Helper()
	waitFor(tb, d, fmt.Sprintf("%d done calls", n), func() bool { return r.total.Load() >= int64(n) })
	time.Sleep(50 * time.Millisecond) // catch calls beyond n
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.total.Load(); got != int64(n) {
		tb.Errorf("done called %d times for %d messages", got, n)
	}
	for id, c := range r.calls {
		if c != 1 {
			tb.Errorf("done called %d times for %s", c, id)
		}
	}
}

// consume reads deliveries from queue until idle for the given time after
// at least want arrived, or until timeout.
func consume(tb testing.TB, queue string, want int, idle, timeout time.Duration) []amqp.Delivery {
	tb.Helper()
	conn, ch := adminChannel(tb)
	defer conn.Close()
	if err := ch.Qos(2000, 0, false); err != nil {
		tb.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		tb.Fatal(err)
	}
	var got []amqp.Delivery
	deadline := time.After(timeout)
	for {
		wait := timeout
		if len(got) >= want {
			wait = idle
		}
		select {
		case d := <-deliveries:
			got = append(got, d)
		case <-time.After(wait):
			return got
		case <-deadline:
			tb.Errorf("consumed %d of %d messages before the timeout", len(got), want)
			return got
		}
	}
}

func TestPublishDeliversWithEveryProperty(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "order.*") // one word each: proves '.' in event_type is escaped
	s := startSink(t, Config{Exchange: f.exchange})

	const n, aggregates = 5000, 37
	run := uniqueName(t)
	rec := newRecorder()
	msgs := make(map[string]*relay.Message, n)
	ctx := context.Background()
	for i := range n {
		m := testMessage(run, i, i%aggregates, "order")
		msgs[m.ID] = m
		s.Publish(ctx, m, rec.done)
	}
	rec.wait(t, n, 30*time.Second)
	for id, err := range rec.errs {
		t.Errorf("message %s failed: %v", id, err)
	}

	const key = "order.order%2Ecreated"
	got := consume(t, f.queue, n, 500*time.Millisecond, 30*time.Second)
	if len(got) != n {
		t.Fatalf("consumed %d messages, want %d", len(got), n)
	}
	lastSeq := map[string]int{}
	for _, d := range got {
		m := msgs[d.MessageId]
		if m == nil {
			t.Fatalf("unexpected message id %q", d.MessageId)
		}
		if m.Destination != f.exchange+"/"+key {
			t.Errorf("Destination = %q", m.Destination)
		}
		wantHeaders := amqp.Table{
			"traceparent": m.Traceparent, "aggregate_id": m.AggregateID, "aggregate_type": "order",
			"tenant": "acme", "seq": m.Headers[1].Value,
		}
		switch {
		case string(d.Body) != string(m.Envelope):
			t.Errorf("%s: body %q, want %q", m.ID, d.Body, m.Envelope)
		case d.Exchange != f.exchange || d.RoutingKey != key:
			t.Errorf("%s: exchange %q routing key %q", m.ID, d.Exchange, d.RoutingKey)
		case d.Type != "order.created", d.ContentType != "application/json", d.DeliveryMode != amqp.Persistent, d.AppId != "outboxrelay":
			t.Errorf("%s: type %q content type %q delivery mode %d app id %q", m.ID, d.Type, d.ContentType, d.DeliveryMode, d.AppId)
		case !d.Timestamp.Equal(m.CommitTime.Truncate(time.Second)):
			t.Errorf("%s: timestamp %s, want %s", m.ID, d.Timestamp, m.CommitTime.Truncate(time.Second))
		case len(d.Headers) != len(wantHeaders)+1:
			t.Errorf("%s: headers %v, want %v and %s", m.ID, d.Headers, wantHeaders, tagHeader)
		}
		if tag, _ := d.Headers[tagHeader].(string); !regexp.MustCompile(`^[1-9][0-9]*$`).MatchString(tag) {
			t.Errorf("%s: header %s = %q, want a delivery tag", m.ID, tagHeader, tag)
		}
		for k, v := range wantHeaders {
			if d.Headers[k] != v {
				t.Errorf("%s: header %s = %v, want %v", m.ID, k, d.Headers[k], v)
			}
		}
		seq, _ := strconv.Atoi(m.Headers[1].Value)
		if last, ok := lastSeq[m.AggregateID]; ok && seq <= last {
			t.Errorf("aggregate %s: seq %d arrived after %d", m.AggregateID, seq, last)
		}
		lastSeq[m.AggregateID] = seq
		if t.Failed() {
			t.FailNow()
		}
	}
}

func TestUnroutableIsPermanentNeverSuccess(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "bound.*")
	s := startSink(t, Config{Exchange: f.exchange})

	const n = 400
	run := uniqueName(t)
	rec := newRecorder()
	for i := range n {
		typ := "bound"
		if i%2 == 1 {
			typ = "nobody"
		}
		s.Publish(context.Background(), testMessage(run, i, i, typ), rec.done)
	}
	rec.wait(t, n, 30*time.Second)
	for i := range n {
		id := testMessage(run, i, i, "").ID
		err := rec.errs[id]
		if i%2 == 0 {
			if err != nil {
				t.Errorf("routable message %s failed: %v", id, err)
			}
			continue
		}
		if err == nil || relay.Retryable(err) || !errors.Is(err, ErrUnroutable) {
			t.Fatalf("unroutable message %s: done(%v), want a permanent ErrUnroutable", id, err)
		}
		if i == 1 {
			t.Logf("unroutable error: %v", err)
		}
	}
	if got := consume(t, f.queue, n/2, 300*time.Millisecond, 20*time.Second); len(got) != n/2 {
		t.Errorf("queue got %d messages, want %d", len(got), n/2)
	}
}

func TestMissingExchangeIsAClearConnectError(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	s, err := New(Config{URL: brokerURL, Exchange: uniqueName(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Connect(context.Background())
	if err == nil || !regexp.MustCompile(`does not exist; create it or set .*declare: true`).MatchString(err.Error()) {
		t.Fatalf("Connect = %v, want a missing exchange error naming the fix", err)
	}
	if regexp.MustCompile(`guest:guest`).MatchString(err.Error()) {
		t.Errorf("password in error: %v", err)
	}
}

func TestDeclareExchange(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	name := uniqueName(t)
	t.Cleanup(func() {
		conn, ch := adminChannel(t)
		defer conn.Close()
		_ = ch.ExchangeDelete(name, false, false)
	})
	f := false
	s := startSink(t, Config{Exchange: name, Declare: true, Durable: &f, ExchangeType: amqp.ExchangeDirect})
	conn, ch := adminChannel(t)
	defer conn.Close()
	if err := ch.ExchangeDeclarePassive(name, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		t.Fatalf("exchange not declared: %v", err)
	}
	if !s.Ready() {
		t.Error("not ready")
	}
}

func TestPublishWaitsForConnectionAndHonoursContext(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "#")
	s, err := New(Config{URL: brokerURL, Exchange: f.exchange}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	run := uniqueName(t)

	// Not running: Publish waits and gives up with its context.
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	s.Publish(ctx, testMessage(run, 0, 0, "order"), rec.done)
	cancel()
	if err := rec.errs[testMessage(run, 0, 0, "").ID]; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("done(%v), want context.DeadlineExceeded", err)
	}

	// Published before Run starts: delivered once Run connects.
	published := make(chan struct{})
	go func() {
		s.Publish(context.Background(), testMessage(run, 1, 0, "order"), rec.done)
		close(published)
	}()
	time.Sleep(100 * time.Millisecond)
	runCtx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(runCtx) }()
	<-published
	rec.wait(t, 2, 10*time.Second)
	if err := rec.errs[testMessage(run, 1, 0, "").ID]; err != nil {
		t.Errorf("message published before Run failed: %v", err)
	}
	stop()
	if err := <-runErr; err != nil {
		t.Errorf("Run = %v", err)
	}
	if s.Ready() {
		t.Error("ready after Run returned")
	}
	// After Run returned, Publish fails at once.
	s.Publish(context.Background(), testMessage(run, 2, 0, "order"), rec.done)
	if err := rec.errs[testMessage(run, 2, 0, "").ID]; !errors.Is(err, ErrClosed) || !relay.Retryable(err) {
		t.Errorf("Publish after Run: done(%v), want retryable ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestCloseFailsWaitingPublish(t *testing.T) {
	verifyNoLeaks(t)
	s, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go s.Publish(context.Background(), &relay.Message{ID: "1", AggregateType: "a"}, func(_ *relay.Message, err error) { got <- err })
	time.Sleep(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrClosed) || !relay.Retryable(err) {
		t.Errorf("done(%v), want retryable ErrClosed", err)
	}
}

// TestServerClosesConnectionMidStream has the broker close every connection
// while 20,000 messages stream: all must arrive at least once, in order per
// aggregate (first arrivals), and every done must be nil.
func TestServerClosesConnectionMidStream(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	const rabbitmqctl = "/usr/sbin/rabbitmqctl"
	if _, err := os.Stat(rabbitmqctl); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no %s (%v); CI must install rabbitmq-server, which provides it (see .ci/services)", rabbitmqctl, err)
		}
		t.Skipf("no %s (%v); install rabbitmq-server to run this test, or set CI=true to make this a failure", rabbitmqctl, err)
	}
	f := newFixture(t, "#")
	s := startSink(t, Config{Exchange: f.exchange, ReconnectBackoffMin: 50 * time.Millisecond, ReconnectBackoffMax: time.Second})

	const n, aggregates = 20000, 50
	run := uniqueName(t)
	rec := newRecorder()
	killed := make(chan error, 1)
	go func() {
		for rec.total.Load() < 1000 {
			time.Sleep(time.Millisecond)
		}
		out, err := exec.Command(rabbitmqctl, "close_all_connections", "test").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("rabbitmqctl: %v: %s", err, out)
		}
		killed <- err
	}()
	var killErr error
	for i := range n {
		// Pace the stream so that it is still running when rabbitmqctl,
		// which takes a second or two to start, closes the connection; and
		// hold the last quarter back until it did.
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
		if i == 3*n/4 {
			killErr = <-killed
		}
		s.Publish(context.Background(), testMessage(run, i, i%aggregates, "order"), rec.done)
	}
	if killErr != nil {
		t.Fatal(killErr)
	}
	rec.wait(t, n, 60*time.Second)
	for id, err := range rec.errs {
		t.Errorf("message %s failed: %v", id, err)
	}
	if s.sessions.Load() < 2 {
		t.Fatalf("the sink never reconnected (sessions %d): the connection was not closed mid-stream", s.sessions.Load())
	}

	got := consume(t, f.queue, n, time.Second, 60*time.Second)
	seen := map[string]bool{}
	firstSeq := map[string]int{}
	dups := 0
	for _, d := range got {
		if seen[d.MessageId] {
			dups++
			continue
		}
		seen[d.MessageId] = true
		agg := d.Headers["aggregate_id"].(string)
		seq, _ := strconv.Atoi(d.Headers["seq"].(string))
		if last, ok := firstSeq[agg]; ok && seq <= last {
			t.Errorf("aggregate %s: first arrival of seq %d after seq %d", agg, seq, last)
		}
		firstSeq[agg] = seq
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages arrived, want %d", len(seen), n)
	}
	t.Logf("sessions %d, republished %d, delivered %d, duplicates %d", s.sessions.Load(), s.republished.Load(), len(got), dups)
}

// TestNackIsRetryable fills a queue that rejects publishes beyond its
// length: the broker nacks those, and the sink reports them retryable.
func TestNackIsRetryable(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t)
	q := f.queue + "-limited"
	conn, ch := adminChannel(t)
	defer conn.Close()
	if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-max-length": 10, "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, ch := adminChannel(t)
		defer conn.Close()
		_, _ = ch.QueueDelete(q, false, false, false)
	})
	if err := ch.QueueBind(q, "#", f.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	s := startSink(t, Config{Exchange: f.exchange})
	const n = 30
	run := uniqueName(t)
	rec := newRecorder()
	for i := range n {
		s.Publish(context.Background(), testMessage(run, i, 0, "order"), rec.done)
	}
	rec.wait(t, n, 10*time.Second)
	ok, nacked := 0, 0
	for i := range n {
		switch err := rec.errs[testMessage(run, i, 0, "").ID]; {
		case err == nil:
			ok++
		case errors.Is(err, ErrNacked) && relay.Retryable(err):
			nacked++
		default:
			t.Errorf("message %d: %v", i, err)
		}
	}
	if ok != 10 || nacked != n-10 {
		t.Errorf("%d acked and %d nacked, want 10 and %d", ok, nacked, n-10)
	}
}

// TestBlockedConnectionPausesPublishing feeds the sink the notification the
// broker sends on a resource alarm (raising a real alarm would stall every
// other user of the test broker).
func TestBlockedConnectionPausesPublishing(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "#")
	s := startSink(t, Config{Exchange: f.exchange})
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	s.setBlocked(sess, amqp.Blocking{Active: true, Reason: "low on memory"})
	if s.Ready() {
		t.Error("ready while blocked")
	}
	run := uniqueName(t)
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	s.Publish(ctx, testMessage(run, 0, 0, "order"), rec.done)
	cancel()
	if err := rec.errs[testMessage(run, 0, 0, "").ID]; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish while blocked: done(%v), want to wait until the context expired", err)
	}
	published := make(chan struct{})
	go func() {
		s.Publish(context.Background(), testMessage(run, 1, 0, "order"), rec.done)
		close(published)
	}()
	time.Sleep(50 * time.Millisecond)
	s.setBlocked(sess, amqp.Blocking{Active: false})
	<-published
	rec.wait(t, 2, 10*time.Second)
	if err := rec.errs[testMessage(run, 1, 0, "").ID]; err != nil || !s.Ready() {
		t.Errorf("after unblock: done(%v), ready %t", err, s.Ready())
	}
}

// TestExchangeDeletedWhileRunning: the broker closes the channel (404) on
// the next publish; the sink keeps the message, retries the connection
// until the exchange is back, then delivers it.
func TestExchangeDeletedWhileRunning(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "#")
	s := startSink(t, Config{Exchange: f.exchange, ReconnectBackoffMin: 20 * time.Millisecond, ReconnectBackoffMax: 100 * time.Millisecond})
	conn, ch := adminChannel(t)
	defer conn.Close()
	if err := ch.ExchangeDelete(f.exchange, false, false); err != nil {
		t.Fatal(err)
	}
	run := uniqueName(t)
	rec := newRecorder()
	s.Publish(context.Background(), testMessage(run, 0, 0, "order"), rec.done)
	waitFor(t, 5*time.Second, "not ready", func() bool { return !s.Ready() })
	time.Sleep(300 * time.Millisecond)
	if rec.total.Load() != 0 {
		t.Fatalf("message reported while the exchange is missing: %v", rec.errs)
	}
	// Holding pubMu keeps the sink from republishing between the declare
	// and the bind, which would make the message unroutable.
	s.pubMu.Lock()
	err1 := ch.ExchangeDeclare(f.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	err2 := ch.QueueBind(f.queue, "#", f.exchange, false, nil)
	s.pubMu.Unlock()
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1, 10*time.Second)
	if err := rec.errs[testMessage(run, 0, 0, "").ID]; err != nil {
		t.Errorf("done(%v) after the exchange came back", err)
	}
	if got := consume(t, f.queue, 1, 200*time.Millisecond, 5*time.Second); len(got) != 1 {
		t.Errorf("queue got %d messages, want 1", len(got))
	}
}

// TestRoutingHeaderIsPermanent: RabbitMQ reads the headers CC and BCC as
// extra routing keys (sender-selected distribution) and closes the channel
// when one is not an array, which a row's string header never is. Such a
// row must be failed with the reason, not retried on channel after channel,
// and the messages around it delivered.
func TestRoutingHeaderIsPermanent(t *testing.T) {
	needBroker(t)
	verifyNoLeaks(t)
	f := newFixture(t, "routed.*")
	s := startSink(t, Config{Exchange: f.exchange})

	run := uniqueName(t)
	rec := newRecorder()
	var msgs []*relay.Message
	for i, h := range []string{"", "CC", "", "BCC", ""} {
		m := testMessage(run, i, i, "routed")
		if h != "" {
			m.Headers = append(m.Headers, envelope.Header{Key: h, Value: "routed.elsewhere"})
		}
		msgs = append(msgs, m)
		s.Publish(context.Background(), m, rec.done)
	}
	rec.wait(t, len(msgs), 30*time.Second)
	for i, m := range msgs {
		err := rec.errs[m.ID]
		if i%2 == 0 {
			if err != nil {
				t.Errorf("message %s: %v", m.ID, err)
			}
			continue
		}
		if err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), "CC") {
			t.Errorf("message %s with a routing header: done(%v), want a permanent error naming the header", m.ID, err)
		}
	}
	if got := consume(t, f.queue, 3, 300*time.Millisecond, 20*time.Second); len(got) != 3 {
		t.Errorf("queue got %d messages, want 3", len(got))
	}
}
