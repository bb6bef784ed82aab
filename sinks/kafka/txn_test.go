package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/relay"
)

// txnSink is a running exactly-once sink on c; stop cancels its Run and
// returns Run's error.
type txnSink struct {
	*TxnSink
	stop func() error
}

func newTxnSink(t testing.TB, c interface{ ListenAddrs() []string }, id string) *txnSink {
	t.Helper()
	s, err := NewTxn(Config{Brokers: c.ListenAddrs(), TransactionalID: id, Topic: "eo"}, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()
	var stopped error
	var once bool
	stop := func() error {
		if !once {
			once = true
			cancel()
			stopped = <-runErr
			s.Close()
		}
		return stopped
	}
	t.Cleanup(func() { stop() })
	return &txnSink{TxnSink: s, stop: stop}
}

// publishTxn publishes n messages as the source transaction that committed
// at lsn and returns a channel that yields each outcome.
func publishTxn(s *TxnSink, prefix string, n int, lsn cdc.LSN) <-chan error {
	out := make(chan error, n)
	for i := range n {
		m := &relay.Message{ID: fmt.Sprintf("%s-%d", prefix, i), AggregateType: "order", AggregateID: "1", EventType: "order.created", Envelope: []byte(`{}`)}
		s.Publish(context.Background(), m, func(_ *relay.Message, err error) { out <- err })
	}
	s.EndTxn(lsn)
	return out
}

func outcomes(t *testing.T, ch <-chan error, n int) []error {
	t.Helper()
	var errs []error
	for range n {
		select {
		case err := <-ch:
			errs = append(errs, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d outcomes after 30s", len(errs), n)
		}
	}
	return errs
}

// TestTxnSinkPositionAndFencing: the position is committed with the
// records; a second producer with the same transactional.id reads it back
// and fences the first, whose later records never reach a read_committed
// consumer.
func TestTxnSinkPositionAndFencing(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := newTxnSink(t, c, "outboxrelay-test")
	if pos, err := a.Position(ctx); err != nil || pos != 0 {
		t.Fatalf("first Position = %v, %v; want 0/0", pos, err)
	}
	for _, err := range outcomes(t, publishTxn(a.TxnSink, "a", 3, 100), 3) {
		if err != nil {
			t.Fatalf("committed message failed: %v", err)
		}
	}

	b := newTxnSink(t, c, "outboxrelay-test")
	if pos, err := b.Position(ctx); err != nil || pos != 100 {
		t.Fatalf("Position of the second producer = %v, %v; want 0/64", pos, err)
	}
	// a is a zombie now: nothing it commits may count.
	for _, err := range outcomes(t, publishTxn(a.TxnSink, "zombie", 2, 200), 2) {
		if err == nil {
			t.Fatal("a fenced producer reported a message committed")
		}
	}
	if err := a.stop(); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("Run of the fenced sink = %v, want an error saying it was fenced off", err)
	}
	for _, err := range outcomes(t, publishTxn(b.TxnSink, "b", 2, 300), 2) {
		if err != nil {
			t.Fatalf("committed message failed: %v", err)
		}
	}
	if pos, err := b.Position(ctx); err != nil || pos != 300 {
		t.Fatalf("Position = %v, %v; want 0/12C", pos, err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("eo"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for len(got) < 5 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			got = append(got, string(r.Headers[0].Value))
		})
	}
	// Anything beyond the committed five would arrive with them.
	short, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	cl.PollFetches(short).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Headers[0].Value)) })
	if want := "a-0 a-1 a-2 b-0 b-1"; strings.Join(got, " ") != want {
		t.Fatalf("read_committed consumer got %v, want %s", got, want)
	}
}

// TestTxnSinkNeedsID: exactly-once mode without a transactional.id is one
// clear error.
func TestTxnSinkNeedsID(t *testing.T) {
	_, err := NewTxn(Config{Brokers: []string{"127.0.0.1:1"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "sink.kafka.transactional_id") {
		t.Fatalf("NewTxn without an id = %v", err)
	}
}

// TestTxnSinkRecommitsAfterFailedCommit: a commit the broker fails starts a
// new producer session, which reads the position back and commits the batch
// again: a read_committed consumer sees each record once.
func TestTxnSinkRecommitsAfterFailedCommit(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newTxnSink(t, c, "outboxrelay-test")
	if _, err := s.Position(ctx); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int32
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !req.(*kmsg.EndTxnRequest).Commit {
			c.KeepControl()
			return nil, nil, false
		}
		failed.Add(1)
		resp := req.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
	for _, err := range outcomes(t, publishTxn(s.TxnSink, "a", 3, 100), 3) {
		if err != nil {
			t.Fatalf("message failed: %v", err)
		}
	}
	if failed.Load() != 1 {
		t.Fatalf("the broker failed %d commits, want 1", failed.Load())
	}
	if pos, err := s.Position(ctx); err != nil || pos != 100 {
		t.Fatalf("Position = %v, %v; want 0/64", pos, err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("eo"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for len(got) < 3 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Headers[0].Value)) })
	}
	short, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	cl.PollFetches(short).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Headers[0].Value)) })
	if want := "a-0 a-1 a-2"; strings.Join(got, " ") != want {
		t.Fatalf("read_committed consumer got %v, want %s", got, want)
	}
}

// produceForged writes recs into the positions topic as another producer:
// in a transaction of its own when txn is set, plainly otherwise.
func produceForged(t *testing.T, c interface{ ListenAddrs() []string }, txn bool, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(DefaultPositionsTopic)}
	if txn {
		opts = append(opts, kgo.TransactionalID("forger"))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if txn {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce forged positions: %v", err)
	}
	if txn {
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPositionIgnoresForgedRecords: records in the positions topic that
// carry the relay's key but that the relay did not write do not move its
// position: one without the relay's header after one with it, one whose
// header names another transactional.id, one whose value is not an LSN in
// the relay's form, one written outside a transaction. Before, any of them
// holding FF/FFFFFFFF made the relay skip every later transaction.
func TestPositionIgnoresForgedRecords(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "outboxrelay-test"
	a := newTxnSink(t, c, id)
	if _, err := a.Position(ctx); err != nil {
		t.Fatal(err)
	}
	for _, err := range outcomes(t, publishTxn(a.TxnSink, "a", 2, 100), 2) {
		if err != nil {
			t.Fatalf("committed message failed: %v", err)
		}
	}
	key, top := []byte(id), []byte("FF/FFFFFFFF")
	mark := func(v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: PositionHeader, Value: []byte(v)}} }
	produceForged(t, c, true,
		&kgo.Record{Key: key, Value: top},                                         // the form of a position before the header
		&kgo.Record{Key: key, Value: top, Headers: mark("outboxrelay-other")},     // another relay's header
		&kgo.Record{Key: key, Value: []byte("ff/ffffffff"), Headers: mark(id)},    // not the relay's LSN form
		&kgo.Record{Key: key, Value: []byte(`"FF/FFFFFFFF"`), Headers: mark(id)},  // a JSON string
		&kgo.Record{Key: key, Value: top, Headers: append(mark(id), mark(id)...)}) // a header twice
	produceForged(t, c, false, &kgo.Record{Key: key, Value: top, Headers: mark(id)})

	b := newTxnSink(t, c, id)
	if pos, err := b.Position(ctx); err != nil || pos != 100 {
		t.Fatalf("Position after forged records = %v, %v; want 0/64, the relay's own", pos, err)
	}
}

// TestPositionReadsUnmarkedRecords: a positions topic written before
// position records carried the relay's header (key and LSN only, in the
// relay's transactions) still gives the position, so an upgraded relay
// resumes where it stopped; once it has written a marked record, only
// marked ones count.
func TestPositionReadsUnmarkedRecords(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "outboxrelay-test"
	a := newTxnSink(t, c, id)
	if _, err := a.Position(ctx); err != nil { // creates the topic
		t.Fatal(err)
	}
	produceForged(t, c, true, &kgo.Record{Key: []byte(id), Value: []byte("0/32")}, &kgo.Record{Key: []byte(id), Value: []byte("0/64")})
	b := newTxnSink(t, c, id)
	if pos, err := b.Position(ctx); err != nil || pos != 100 {
		t.Fatalf("Position from unmarked records = %v, %v; want 0/64", pos, err)
	}
	for _, err := range outcomes(t, publishTxn(b.TxnSink, "b", 1, 150), 1) {
		if err != nil {
			t.Fatalf("committed message failed: %v", err)
		}
	}
	produceForged(t, c, true, &kgo.Record{Key: []byte(id), Value: []byte("FF/FFFFFFFF")})
	d := newTxnSink(t, c, id)
	if pos, err := d.Position(ctx); err != nil || pos != 150 {
		t.Fatalf("Position = %v, %v; want 0/96, the marked record's", pos, err)
	}
}

// TestTxnSinkCloseStopsRun: Close ends a Run whose context is still live
// and waits for it, as it does for every Runner sink (sinks.Lifecycle);
// a second Close does nothing, and Publish after Close fails retryably.
func TestTxnSinkCloseStopsRun(t *testing.T) {
	c := newCluster(t)
	s, err := NewTxn(Config{Brokers: c.ListenAddrs(), TransactionalID: "close-stops-run", Topic: "eo"}, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(context.Background()) }()
	for _, err := range outcomes(t, publishTxn(s, "c", 2, 100), 2) {
		if err != nil {
			t.Fatalf("committed message failed: %v", err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Run after Close = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs 10s after Close")
	}
	if err := <-closed; err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if errs := outcomes(t, publishTxn(s, "late", 1, 200), 1); !errors.Is(errs[0], kgo.ErrClientClosed) {
		t.Errorf("Publish after Close = %v, want ErrClientClosed", errs[0])
	}
}
