package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// serverAddr is the nats-server (JetStream on) the tests use.
const (
	serverAddr = "127.0.0.1:4222"
	serverURL  = "nats://" + serverAddr
)

func needServer(tb testing.TB) {
	tb.Helper()
	pgservertest.RequireTCP(tb, serverAddr, "nats-server with JetStream (nats-server -js)")
}

// fixture is a stream of its own, on subjects of its own, deleted when the
// test ends.
type fixture struct {
	stream, prefix string
	nc             *natsgo.Conn
	js             jetstream.JetStream
}

// newFixture creates a stream capturing prefix.> with cfg's settings.
func newFixture(tb testing.TB, mod func(*jetstream.StreamConfig)) *fixture {
	tb.Helper()
	id := sinktest.RandomHex(4)
	f := &fixture{stream: "TEST_" + strings.ToUpper(id), prefix: "t" + id}
	f.nc, f.js = adminConn(tb)
	cfg := jetstream.StreamConfig{
		Name: f.stream, Subjects: []string{f.prefix + ".>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.js.CreateStream(ctx, cfg); err != nil {
		tb.Fatalf("create stream: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.js.DeleteStream(ctx, f.stream)
	})
	return f
}

func adminConn(tb testing.TB) (*natsgo.Conn, jetstream.JetStream) {
	tb.Helper()
	return adminConnURL(tb, serverURL)
}

func adminConnURL(tb testing.TB, url string) (*natsgo.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

func (f *fixture) config() Config {
	return Config{URL: serverURL, Subject: f.prefix + ".{aggregate_type}.{event_type}", Stream: f.stream}
}

// startSink connects a sink and runs it until the test ends.
func startSink(tb testing.TB, cfg Config) *Sink {
	tb.Helper()
	s, err := New(cfg, zaptest.NewLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Connect(ctx); err != nil {
		tb.Fatal(err)
	}
	sinktest.RunSink(tb, s)
	return s
}

// factory runs the shared sink suite against one stream.
type factory struct{ f *fixture }

func (fa factory) NewSink(t *testing.T) relay.Sink { return startSink(t, fa.f.config()) }

func (fa factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	return fa.f.consumer(t, fa.f.prefix+"."+string(tokenEscape.Append(nil, aggregateType))+".>")
}

// consumer reads the stream's messages on filter from the start.
func (f *fixture) consumer(tb testing.TB, filter string) *consumer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := f.js.OrderedConsumer(ctx, f.stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		tb.Fatalf("ordered consumer: %v", err)
	}
	it, err := c.Messages()
	if err != nil {
		tb.Fatalf("messages: %v", err)
	}
	tb.Cleanup(it.Stop)
	return &consumer{it: it}
}

type consumer struct{ it jetstream.MessagesContext }

func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	m, err := c.it.Next(jetstream.NextContext(ctx))
	if err != nil {
		return sinktest.Received{}, err
	}
	h := make(map[string]string, len(m.Headers()))
	var all []envelope.Header
	for k, v := range m.Headers() {
		h[k] = v[0]
		for _, x := range v {
			all = append(all, envelope.Header{Key: k, Value: x})
		}
	}
	return sinktest.Received{ID: h[HeaderMessageID], Key: h[HeaderAggregateID], Headers: h, Body: m.Data(), All: all}, nil
}

func TestSinkSuite(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	sinktest.Run(t, factory{newFixture(t, nil)})
}

// clone returns copies of msgs with the same ids: what a relay that
// restarted publishes again.
func clone(msgs []*relay.Message) []*relay.Message {
	out := make([]*relay.Message, len(msgs))
	for i, m := range msgs {
		c := *m
		c.Destination = ""
		out[i] = &c
	}
	return out
}

// TestDedupeAcrossSinks is a crash and redelivery: one sink publishes
// messages and is closed with some in flight, a new sink publishes all of
// them again, and the stream holds each exactly once, in order per
// aggregate.
func TestDedupeAcrossSinks(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t, nil)
	const n = 3000
	msgs := sinktest.Messages("dedupe", n, 30)

	s1, err := New(f.config(), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Connect(t.Context()); err != nil {
		t.Fatal(err)
	}
	r1 := sinktest.NewRecorder()
	for _, m := range msgs {
		s1.Publish(t.Context(), m, r1.Done)
	}
	r1.Wait(t, n/2, time.Minute)       // crash half-way through the acknowledgements
	if err := s1.Close(); err != nil { // whatever is in flight is cut off
		t.Fatal(err)
	}
	acked := 0
	for _, err := range r1.Wait(t, n-n/2, time.Minute) {
		if err == nil {
			acked++
		} else if !errors.Is(err, ErrClosed) {
			t.Errorf("first sink: %v", err)
		}
	}
	before := f.count(t)
	t.Logf("first sink: %d of %d acknowledged before Close, %d in the stream", acked, n, before)
	if before < uint64(acked) {
		t.Fatalf("stream holds %d messages, fewer than the %d acknowledged", before, acked)
	}

	// A second sink republishes everything, twice over.
	s2 := startSink(t, f.config())
	for round := range 2 {
		again := clone(msgs)
		r2 := sinktest.NewRecorder()
		for _, m := range again {
			s2.Publish(t.Context(), m, r2.Done)
		}
		for m, err := range r2.Wait(t, n, 60*time.Second) {
			if err != nil {
				t.Fatalf("round %d: message %s: %v", round, m.ID, err)
			}
		}
	}

	if got := f.count(t); got != n {
		t.Errorf("stream holds %d messages, want exactly %d (one per message id)", got, n)
	}
	c := f.consumer(t, f.prefix+".>")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	got := sinktest.ReceiveAll(ctx, t, c, msgs)
	if len(got) != n {
		t.Errorf("received %d messages, want %d", len(got), n)
	}
	sinktest.CheckOrder(t, msgs, got)
}

// count returns the number of messages in the stream.
func (f *fixture) count(tb testing.TB) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return info.State.Msgs
}

// TestCreateStream: Connect creates the stream from the template's prefix
// with the duplicate window, and an existing stream is left as it is.
func TestCreateStream(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	_, js := adminConn(t)
	id := sinktest.RandomHex(4)
	name := "CREATE_" + strings.ToUpper(id)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	cfg := Config{URL: serverURL, Subject: "c" + id + ".events.{aggregate_type}.{event_type}", Stream: name, CreateStream: true, DuplicateWindow: 5 * time.Minute}

	s := startSink(t, cfg)
	st, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream not created: %v", err)
	}
	info := st.CachedInfo()
	if want := []string{"c" + id + ".events.>"}; fmt.Sprint(info.Config.Subjects) != fmt.Sprint(want) {
		t.Errorf("subjects %v, want %v", info.Config.Subjects, want)
	}
	if info.Config.Duplicates != 5*time.Minute {
		t.Errorf("duplicate window %v, want 5m", info.Config.Duplicates)
	}
	msgs := sinktest.Messages("created", 10, 2)
	r := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	for m, err := range r.Wait(t, len(msgs), 30*time.Second) {
		if err != nil {
			t.Errorf("message %s: %v", m.ID, err)
		}
	}

	// A second Connect finds the stream.
	startSink(t, cfg)
}

func TestMissingStream(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	s, err := New(Config{URL: serverURL, Stream: "MISSING_" + strings.ToUpper(sinktest.RandomHex(4))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Connect(t.Context())
	if err == nil || !strings.Contains(err.Error(), "create_stream") {
		t.Fatalf("Connect: %v, want an error naming create_stream", err)
	}
	if s.Ready() {
		t.Error("Ready after a failed Connect")
	}
}

func TestConnectUnreachable(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	s, err := New(Config{URL: "nats://relay:s3cret@127.0.0.1:1", DialTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sinktest.CheckUnreachable(t, s, "s3cret", "sink.nats.url")
}

// TestPermanentFailures: messages the server will never store fail with
// relay.Permanent, and the messages around them are published.
func TestPermanentFailures(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	other := newFixture(t, nil) // captures other.prefix.>
	s := startSink(t, f.config())

	perm := func() *relay.Message { return sinktest.Messages("perm", 1, 1)[0] }
	tooBigForStream := perm()
	tooBigForStream.Envelope = make([]byte, 8192)
	tooBigForServer := perm()
	tooBigForServer.Envelope = make([]byte, 2<<20) // over max_payload (1 MiB)
	emptyToken := perm()
	emptyToken.EventType = ""
	reserved := perm()
	reserved.Headers = append(reserved.Headers, envelope.Header{Key: "Nats-Rollup", Value: "all"})
	badHeader := perm()
	badHeader.Headers = append(badHeader.Headers, envelope.Header{Key: "bad key:", Value: "x"})
	bad := []*relay.Message{tooBigForStream, tooBigForServer, emptyToken, reserved, badHeader}
	good := sinktest.Messages("good", len(bad)+1, 1)

	// A sink whose template sends to a subject another stream captures:
	// Nats-Expected-Stream makes the server refuse it.
	wrongCfg := f.config()
	wrongCfg.Subject = other.prefix + ".{aggregate_type}"
	wrong := startSink(t, wrongCfg)
	wrongStream := perm()

	r := sinktest.NewRecorder()
	s.Publish(t.Context(), good[0], r.Done)
	for i, m := range bad {
		s.Publish(t.Context(), m, r.Done)
		s.Publish(t.Context(), good[i+1], r.Done)
	}
	wrong.Publish(t.Context(), wrongStream, r.Done)
	errs := r.Wait(t, len(good)+len(bad)+1, 30*time.Second)
	for _, m := range append(bad, wrongStream) {
		err := errs[m]
		if err == nil || relay.Retryable(err) {
			t.Errorf("message with %s: err %v, want a permanent error", describe(m), err)
		} else {
			t.Logf("%s: %v", describe(m), err)
		}
	}
	for _, m := range good {
		if err := errs[m]; err != nil {
			t.Errorf("good message %s failed: %v", m.ID, err)
		}
	}
}

func describe(m *relay.Message) string {
	switch {
	case len(m.Envelope) > 1<<20:
		return "a body over max_payload"
	case len(m.Envelope) > 4096:
		return "a body over the stream's max_msg_size"
	case m.EventType == "":
		return "an empty subject token"
	case len(m.Headers) > 0:
		return "header " + m.Headers[len(m.Headers)-1].Key
	default:
		return "a subject of another stream"
	}
}

// TestNoResponders: a subject no stream captures is retried with Ready
// false until a stream appears; then every message is stored once. (Order
// is not checked: a stream that starts capturing the subjects in the middle
// of a republication takes a suffix of it before the prefix is sent again;
// see the package documentation.)
func TestNoResponders(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t, nil)
	cfg := f.config()
	late := "l" + sinktest.RandomHex(4)
	cfg.Subject = late + ".{aggregate_type}"
	s := startSink(t, cfg)

	msgs := sinktest.Messages("late", 20, 2)
	r := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("Ready stays true while the stream does not capture the subjects")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if r.Reported() > 0 {
		t.Fatal("a message was reported while no stream captures its subject")
	}

	st, err := f.js.Stream(t.Context(), f.stream)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.Subjects = append(sc.Subjects, late+".>")
	if _, err := f.js.UpdateStream(t.Context(), sc); err != nil {
		t.Fatal(err)
	}
	for m, err := range r.Wait(t, len(msgs), 30*time.Second) {
		if err != nil {
			t.Errorf("message %s: %v", m.ID, err)
		}
	}
	c := f.consumer(t, late+".>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if got := sinktest.ReceiveAll(ctx, t, c, msgs); len(got) != len(msgs) {
		t.Errorf("received %d messages, want %d", len(got), len(msgs))
	}
	deadline = time.Now().Add(5 * time.Second)
	for !s.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("Ready stays false after the stream captured the subjects")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReadyAfterClose(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t, nil)
	s := startSink(t, f.config())
	if !s.Ready() {
		t.Fatal("not ready after Connect")
	}
	_ = s.Close()
	if s.Ready() {
		t.Fatal("ready after Close")
	}
	r := sinktest.NewRecorder()
	m := sinktest.Messages("closed", 1, 1)[0]
	s.Publish(t.Context(), m, r.Done)
	if err := r.Wait(t, 1, time.Second)[m]; !errors.Is(err, ErrClosed) || !relay.Retryable(err) {
		t.Fatalf("Publish after Close: %v, want retryable ErrClosed", err)
	}
}

// TestHeaderValueNATSWouldAlter: nats.go trims the whitespace around a
// header value and turns CR and LF into spaces, so a consumer would read an
// aggregate_id of "42 " as "42", merging two aggregates, and a row header
// other than what the database holds. Such a message fails with the reason
// instead, and the messages around it arrive.
func TestHeaderValueNATSWouldAlter(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t, nil)
	s := startSink(t, f.config())

	msgs := sinktest.Messages("alter", 4, 4)
	msgs[1].AggregateID = "42 "
	msgs[2].Headers = append(msgs[2].Headers, envelope.Header{Key: "note", Value: "line\r\nNats-Rollup: all"})
	bad := map[*relay.Message]string{msgs[1]: `"aggregate_id"`, msgs[2]: `"note"`}
	r := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	errs := r.Wait(t, len(msgs), 30*time.Second)
	for _, m := range msgs {
		err := errs[m]
		want, isBad := bad[m]
		switch {
		case isBad && (err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), want)):
			t.Errorf("message %s: err %v, want a permanent error naming the header %s", m.ID, err, want)
		case !isBad && err != nil:
			t.Errorf("message %s: %v", m.ID, err)
		}
	}
	c := f.consumer(t, f.prefix+".>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for range 2 {
		got, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != msgs[0].ID && got.ID != msgs[3].ID {
			t.Errorf("received %s, whose header values NATS would have changed", got.ID)
		}
	}
}
