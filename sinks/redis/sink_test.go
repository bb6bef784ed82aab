package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

const (
	serverAddr = "127.0.0.1:6379"
	serverURL  = "redis://" + serverAddr + "/0"
)

func needServer(tb testing.TB) {
	tb.Helper()
	pgservertest.RequireTCP(tb, serverAddr, "Redis")
}

// fixture is a key prefix of the test's own; its keys are deleted when the
// test ends.
type fixture struct {
	prefix string
	rdb    *goredis.Client
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	return newFixtureURL(tb, serverURL)
}

func newFixtureURL(tb testing.TB, url string) *fixture {
	tb.Helper()
	opts, err := goredis.ParseURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	f := &fixture{prefix: "outboxrelay-test:" + sinktest.RandomHex(4) + ":", rdb: goredis.NewClient(opts)}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var keys []string
		iter := f.rdb.Scan(ctx, 0, f.prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			f.rdb.Del(ctx, keys...)
		}
		f.rdb.Close()
	})
	return f
}

func (f *fixture) config() Config {
	return Config{URL: serverURL, Stream: f.prefix + "{aggregate_type}"}
}

func startSink(tb testing.TB, cfg Config) *Sink {
	tb.Helper()
	s, err := New(cfg, zaptest.NewLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Connect(ctx); err != nil {
		s.Close()
		tb.Fatal(err)
	}
	sinktest.RunSink(tb, s)
	return s
}

type factory struct{ f *fixture }

func (fa factory) NewSink(t *testing.T) relay.Sink { return startSink(t, fa.f.config()) }

func (fa factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	return &consumer{rdb: fa.f.rdb, key: fa.f.prefix + aggregateType, last: "0"}
}

// consumer reads one stream from its start with XREAD.
type consumer struct {
	rdb     *goredis.Client
	key     string
	last    string
	pending []goredis.XMessage
}

func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	for len(c.pending) == 0 {
		res, err := c.rdb.XRead(ctx, &goredis.XReadArgs{Streams: []string{c.key, c.last}, Count: 1000, Block: 200 * time.Millisecond}).Result()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			return sinktest.Received{}, err
		}
		for _, s := range res {
			c.pending = append(c.pending, s.Messages...)
		}
	}
	x := c.pending[0]
	c.pending = c.pending[1:]
	c.last = x.ID
	r := received(x)
	// The entry as sent, field by field: a map would hide repeats.
	raw, err := c.rdb.Do(ctx, "XRANGE", c.key, x.ID, x.ID).Slice()
	if err != nil || len(raw) != 1 {
		return r, fmt.Errorf("XRANGE %s: %v", x.ID, err)
	}
	kv, _ := raw[0].([]any)[1].([]any)
	for i := 0; i+1 < len(kv); i += 2 {
		k, v := fmt.Sprint(kv[i]), fmt.Sprint(kv[i+1])
		if k != FieldEnvelope && k != FieldHeaders {
			r.All = append(r.All, envelope.Header{Key: k, Value: v})
		}
	}
	return r, nil
}

// received maps an entry to what the suite checks: row headers and the
// traceparent field as headers.
func received(x goredis.XMessage) sinktest.Received {
	str := func(k string) string { s, _ := x.Values[k].(string); return s }
	h := map[string]string{FieldTraceparent: str(FieldTraceparent), FieldEventType: str(FieldEventType)}
	if raw := str(FieldHeaders); raw != "" {
		var row map[string]string
		if err := json.Unmarshal([]byte(raw), &row); err == nil {
			for k, v := range row {
				h[k] = v
			}
		}
	}
	return sinktest.Received{ID: str(FieldMessageID), Key: str(FieldAggregateID), Headers: h, Body: []byte(str(FieldEnvelope))}
}

func TestSinkSuite(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	sinktest.Run(t, factory{newFixture(t)})
}

// TestFields: every entry has the fields of the package documentation, in
// order, with the envelope unchanged; headers only when the row has some.
func TestFields(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t)
	s := startSink(t, f.config())
	msgs := sinktest.Messages("fields", 2, 1)
	msgs[0].Headers = []envelope.Header{{Key: "tenant", Value: "acme"}, {Key: "quote\"d", Value: "line\nbreak"}, {Key: "n", Value: "42"}}
	r := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	for m, err := range r.Wait(t, 2, 10*time.Second) {
		if err != nil {
			t.Fatalf("message %s: %v", m.ID, err)
		}
	}
	key := f.prefix + "fields"
	if msgs[0].Destination != key {
		t.Errorf("Destination %q, want %q", msgs[0].Destination, key)
	}
	// XRANGE through a RESP2 connection keeps field order.
	raw, err := f.rdb.Do(t.Context(), "XRANGE", key, "-", "+").Slice()
	if err != nil || len(raw) != 2 {
		t.Fatalf("XRANGE: %v, %d entries", err, len(raw))
	}
	for i, e := range raw {
		entry := e.([]any)
		var names []string
		vals := map[string]string{}
		for j, kv := 0, entry[1].([]any); j < len(kv); j += 2 {
			names = append(names, kv[j].(string))
			vals[kv[j].(string)] = kv[j+1].(string)
		}
		want := "message_id event_type aggregate_id aggregate_type traceparent content-type headers envelope"
		if i == 1 {
			want = "message_id event_type aggregate_id aggregate_type traceparent content-type envelope"
		}
		if got := strings.Join(names, " "); got != want {
			t.Errorf("entry %d fields %q, want %q", i, got, want)
		}
		m := msgs[i]
		for k, v := range map[string]string{
			FieldMessageID: m.ID, FieldEventType: m.EventType, FieldAggregateID: m.AggregateID,
			FieldTraceparent: m.Traceparent, FieldEnvelope: string(m.Envelope),
		} {
			if vals[k] != v {
				t.Errorf("entry %d field %s = %q, want %q", i, k, vals[k], v)
			}
		}
		if i == 0 {
			if want := `{"tenant":"acme","quote\"d":"line\nbreak","n":"42"}`; vals[FieldHeaders] != want {
				t.Errorf("headers %s, want %s", vals[FieldHeaders], want)
			}
		}
	}
}

// TestMaxLen: MAXLEN ~ keeps the stream near the limit, never below it.
func TestMaxLen(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t)
	cfg := f.config()
	cfg.MaxLen = 100
	s := startSink(t, cfg)
	const n = 5000
	msgs := sinktest.Messages("trim", n, 10)
	r := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	for m, err := range r.Wait(t, n, 30*time.Second) {
		if err != nil {
			t.Fatalf("message %s: %v", m.ID, err)
		}
	}
	l, err := f.rdb.XLen(t.Context(), f.prefix+"trim").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("XLEN after %d appends with MAXLEN ~ 100: %d", n, l)
	// Approximate trimming removes whole macro nodes (100 entries by
	// default), so up to one node more stays.
	if l < 100 || l > 300 {
		t.Errorf("XLEN %d, want about 100", l)
	}
	last, err := f.rdb.XRevRangeN(t.Context(), f.prefix+"trim", "+", "-", 1).Result()
	if err != nil || len(last) != 1 || last[0].Values[FieldMessageID] != msgs[n-1].ID {
		t.Errorf("newest entry %v (%v), want message %s", last, err, msgs[n-1].ID)
	}
}

// TestWrongType: a key that holds another type fails its messages
// permanently; the rest of the batch is appended.
func TestWrongType(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t)
	if err := f.rdb.Set(t.Context(), f.prefix+"taken", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := startSink(t, f.config())
	bad := sinktest.Messages("taken", 3, 1)
	good := sinktest.Messages("free", 3, 1)
	r := sinktest.NewRecorder()
	for i := range bad {
		s.Publish(t.Context(), good[i], r.Done)
		s.Publish(t.Context(), bad[i], r.Done)
	}
	errs := r.Wait(t, 6, 10*time.Second)
	for _, m := range bad {
		if err := errs[m]; err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("message to a string key: %v, want a permanent WRONGTYPE error", err)
		}
	}
	for _, m := range good {
		if err := errs[m]; err != nil {
			t.Errorf("message to a stream: %v", err)
		}
	}
	if l, _ := f.rdb.XLen(t.Context(), f.prefix+"free").Result(); l != 3 {
		t.Errorf("XLEN %d, want 3", l)
	}
	if !s.Ready() {
		t.Error("not ready after permanent failures")
	}
}

func TestConnectUnreachable(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	s, err := New(Config{URL: "redis://u:s3cret@127.0.0.1:1/0", DialTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sinktest.CheckUnreachable(t, s, "s3cret", "sink.redis.url")
}

func TestPublishAfterClose(t *testing.T) {
	sinktest.VerifyNoLeaks(t)
	s, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := sinktest.NewRecorder()
	queued := sinktest.Messages("queued", 3, 1)
	for _, m := range queued { // queued without Run
		s.Publish(t.Context(), m, r.Done)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	late := sinktest.Messages("late", 1, 1)[0]
	s.Publish(t.Context(), late, r.Done)
	for m, err := range r.Wait(t, 4, time.Second) {
		if !errors.Is(err, ErrClosed) || !relay.Retryable(err) {
			t.Errorf("message %s: %v, want retryable ErrClosed", m.ID, err)
		}
	}
	if err := s.Run(t.Context()); err != nil {
		t.Errorf("Run after Close: %v", err)
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	err := Config{URL: "http://u:s3cret@h/0", Stream: "x:{nope}", MaxLen: -1, BatchSize: -1}.Validate()
	if err == nil {
		t.Fatal("invalid Config validated")
	}
	for _, want := range []string{"sink.redis.url", "sink.redis.stream", "sink.redis.max_len", "sink.redis.batch_size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error shows the password: %v", err)
	}
}

func TestRender(t *testing.T) {
	tmpl, err := parseTemplate("outbox:{aggregate_type}:{event_type}:{table}")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.render(&relay.Message{AggregateType: "order", EventType: "order.created", Table: "public.outbox"})
	if want := "outbox:order:order.created:public.outbox"; got != want || err != nil {
		t.Errorf("render = %q, %v; want %q", got, err, want)
	}
	for _, s := range []string{"", "{x}", "a{", "a}", "{aggregate_type", "__outboxrelay_{aggregate_type}"} {
		if _, err := parseTemplate(s); err == nil {
			t.Errorf("parseTemplate(%q) succeeded", s)
		}
	}
}

// TestContained: a stream key that is not valid UTF-8 or that starts with
// the relay's own prefix, and a field that is not valid UTF-8, fail the
// message permanently, naming the key or field, before anything is sent.
func TestContained(t *testing.T) {
	tmpl, err := parseTemplate("{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ aggType, want string }{
		{"caf\xe9", `redis stream key "caf\xe9" is not valid UTF-8 (byte 0xE9 at offset 3)`},
		{"__outboxrelay_positions", `redis stream key "__outboxrelay_positions" is reserved for the relay's own use`},
	} {
		if key, err := tmpl.render(&relay.Message{ID: "1", AggregateType: c.aggType}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("aggregate_type %q rendered %q, %v; want an error containing %s", c.aggType, key, err, c.want)
		}
	}
	m := &relay.Message{ID: "1", AggregateType: "order", AggregateID: "caf\xe9", EventType: "x"}
	if _, err := newItem(m, nil, "order", 0); err == nil || !strings.Contains(err.Error(), `header "aggregate_id" value "caf\xe9" is not valid UTF-8`) {
		t.Errorf("aggregate_id that is not UTF-8: %v, want an error naming the field", err)
	}
}

func TestPermanent(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{goredis.ErrClosed, false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("x: %w", errors.New("WRONGTYPE plain error, not from redis")), false},
	} {
		if got := permanent(c.err); got != c.want {
			t.Errorf("permanent(%v) = %v", c.err, got)
		}
	}
}

// TestWaitReplicas: with wait_replicas 1 and a server without replicas,
// every message is appended on the primary but fails, retryable, naming
// the setting; the sink is not ready. wait_replicas 0, the default, sends
// no WAIT and confirms on the primary's reply.
func TestWaitReplicas(t *testing.T) {
	needServer(t)
	sinktest.VerifyNoLeaks(t)
	f := newFixture(t)
	info, err := f.rdb.Info(t.Context(), "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("the test needs a Redis without replicas:\n%s", info)
	}

	cfg := f.config()
	cfg.WaitReplicas = 1
	cfg.WaitTimeout = 100 * time.Millisecond
	s := startSink(t, cfg)
	msgs := sinktest.Messages("waited", 3, 1)
	r := sinktest.NewRecorder()
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	for m, err := range r.Wait(t, len(msgs), 30*time.Second) {
		if err == nil || !relay.Retryable(err) || !errors.Is(err, ErrTooFewReplicas) ||
			!strings.Contains(err.Error(), "0 of the 1 replicas sink.redis.wait_replicas asks for") {
			t.Errorf("message %s: %v, want a retryable error saying 0 of the 1 replicas acknowledged it", m.ID, err)
		}
	}
	if l, err := f.rdb.XLen(t.Context(), f.prefix+"waited").Result(); err != nil || l != int64(len(msgs)) {
		t.Errorf("XLEN %d (%v), want %d: the primary holds the batch", l, err, len(msgs))
	}
	if s.Ready() {
		t.Error("ready while batches lack their replicas")
	}

	cfg.WaitReplicas = 0
	s = startSink(t, cfg)
	r = sinktest.NewRecorder()
	msgs = sinktest.Messages("unwaited", 3, 1)
	for _, m := range msgs {
		s.Publish(t.Context(), m, r.Done)
	}
	for m, err := range r.Wait(t, len(msgs), 30*time.Second) {
		if err != nil {
			t.Errorf("message %s with wait_replicas 0: %v", m.ID, err)
		}
	}
	if !s.Ready() {
		t.Error("not ready with wait_replicas 0")
	}
}
