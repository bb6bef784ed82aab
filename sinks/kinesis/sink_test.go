package kinesis

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"go.uber.org/zap/zaptest"

	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks/internal/awssink"
	"github.com/outboxrelay/outboxrelay/sinks/sinktest"
)

// kinesaliteBin is where .ci/interop-deps installs kinesalite.
func kinesaliteBin() []string {
	dir := os.Getenv("OUTBOXRELAY_TEST_INTEROP_DIR")
	if dir == "" {
		if c, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(c, "outboxrelay", "interop")
		}
	}
	return []string{filepath.Join(dir, "node_modules", ".bin", "kinesalite")}
}

// startKinesalite starts kinesalite 3.3.3 on a port of the test's own,
// its streams in memory; missing, it skips the test, and fails it under
// CI=true.
func startKinesalite(tb testing.TB) *sinktest.Server {
	return sinktest.StartServer(tb, "kinesalite", kinesaliteBin(), func(port int, _ string) []string {
		return []string{"--port", strconv.Itoa(port), "--createStreamMs", "0", "--deleteStreamMs", "0", "--updateStreamMs", "0", "--shardLimit", "1000"}
	})
}

func testConfig(addr, stream string) Config {
	return Config{
		Stream: stream, Connection: awssink.Connection{Region: "us-east-1", Endpoint: "http://" + addr,
			AccessKeyID: "test", SecretAccessKey: "test", Timeout: 5 * time.Second},
	}
}

func testClient(tb testing.TB, addr string) *kinesis.Client {
	tb.Helper()
	s, err := New(testConfig(addr, "x"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	return s.client
}

func createStream(tb testing.TB, c *kinesis.Client, name string, shards int32) {
	tb.Helper()
	ctx := context.Background()
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)}); err != nil {
		tb.Fatal(err)
	}
	w := kinesis.NewStreamExistsWaiter(c, func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay = 50 * time.Millisecond })
	if err := w.Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, 10*time.Second); err != nil {
		tb.Fatal(err)
	}
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

type factory struct {
	addr   string
	client *kinesis.Client
}

func (factory) Headerless() {}

func (fa factory) NewSink(t *testing.T) relay.Sink {
	return startSink(t, testConfig(fa.addr, "{aggregate_type}"))
}

func (fa factory) Subscribe(t *testing.T, aggregateType string) sinktest.Consumer {
	createStream(t, fa.client, aggregateType, 2)
	return newConsumer(t, fa.client, aggregateType)
}

// consumer reads every shard of a stream from its start, in turn.
type consumer struct {
	client    *kinesis.Client
	iterators []*string
	pending   []types.Record
	turn      int
}

func newConsumer(tb testing.TB, c *kinesis.Client, stream string) *consumer {
	tb.Helper()
	ctx := context.Background()
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		tb.Fatal(err)
	}
	co := &consumer{client: c}
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			tb.Fatal(err)
		}
		co.iterators = append(co.iterators, it.ShardIterator)
	}
	return co
}

func (c *consumer) Next(ctx context.Context) (sinktest.Received, error) {
	for len(c.pending) == 0 {
		i := c.turn % len(c.iterators)
		c.turn++
		out, err := c.client.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: c.iterators[i]})
		if err != nil {
			return sinktest.Received{}, err
		}
		c.iterators[i] = out.NextShardIterator
		c.pending = out.Records
		if len(c.pending) == 0 && i == len(c.iterators)-1 {
			select {
			case <-ctx.Done():
				return sinktest.Received{}, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	r := c.pending[0]
	c.pending = c.pending[1:]
	return received(r), nil
}

// received reads the message id from the envelope: a record has no
// headers.
func received(r types.Record) sinktest.Received {
	var env struct {
		ID string `json:"message_id"`
	}
	_ = json.Unmarshal(r.Data, &env) // a body that is not JSON has no id, and the suite reports it unexpected
	return sinktest.Received{ID: env.ID, Key: aws.ToString(r.PartitionKey), Body: r.Data}
}

func TestSuite(t *testing.T) {
	srv := startKinesalite(t)
	sinktest.Run(t, factory{addr: srv.Addr(), client: testClient(t, srv.Addr())})
}

// TestBatchHoldsOneRecordPerAggregate: a PutRecords call never holds two
// records of one aggregate (Kinesis does not keep the order within a
// call), so an aggregate's messages reach its shard one call after
// another, in order.
func TestBatchHoldsOneRecordPerAggregate(t *testing.T) {
	srv := startKinesalite(t)
	c := testClient(t, srv.Addr())
	createStream(t, c, "orders", 1)
	s, err := New(testConfig(srv.Addr(), "orders"), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	msgs := sinktest.Messages("orders", 300, 3)
	tr := sinktest.NewTracker(msgs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range msgs { // queued before Run: every aggregate has a chain
		s.Publish(ctx, m, tr.Done)
	}
	if got := len(s.queue); got != 3 {
		t.Errorf("%d messages ready to put, want one per aggregate (3)", got)
	}
	for _, b := range s.batch(<-s.queue) {
		seen := map[aggregate]bool{}
		for _, it := range b {
			if seen[it.key] {
				t.Errorf("a batch holds two records of aggregate %s", it.key.key)
			}
			seen[it.key] = true
			s.queue <- it
		}
	}
	sinktest.RunSink(t, s)
	tr.Wait(ctx, t)
	tr.CheckAllAcked(t)
	got := sinktest.ReceiveAll(ctx, t, newConsumer(t, c, "orders"), msgs)
	sinktest.CheckOrder(t, msgs, got)
}

func TestConnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	t.Run("unreachable", func(t *testing.T) {
		s, err := New(testConfig(closed, "orders"), nil)
		if err != nil {
			t.Fatal(err)
		}
		sinktest.CheckUnreachable(t, s, "no-secret", "cannot reach kinesis", "sink.kinesis.endpoint")
	})
	t.Run("missing stream", func(t *testing.T) {
		srv := startKinesalite(t)
		s, err := New(testConfig(srv.Addr(), "absent"), nil)
		if err != nil {
			t.Fatal(err)
		}
		sinktest.CheckUnreachable(t, s, "no-secret", "kinesis stream absent does not exist", "sink.kinesis.stream")
	})
	t.Run("missing credentials", func(t *testing.T) {
		for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"} {
			t.Setenv(k, "")
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
		t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
		t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
		cfg := testConfig(closed, "orders")
		cfg.AccessKeyID, cfg.SecretAccessKey = "", ""
		s, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		err = s.Connect(context.Background())
		if err == nil || !strings.Contains(err.Error(), "no AWS credentials") || !strings.Contains(err.Error(), "sink.kinesis.access_key_id") {
			t.Errorf("Connect without credentials: %v, want an error naming sink.kinesis.access_key_id", err)
		}
	})
}

func TestValidate(t *testing.T) {
	err := Config{Stream: "{aggregatetype}", Connection: awssink.Connection{AccessKeyID: "a", Endpoint: "ftp://x"}, MaxRequests: -1}.Validate()
	for _, want := range []string{
		"sink.kinesis.stream: stream template",
		"unknown placeholder {aggregatetype}",
		"sink.kinesis.endpoint \"ftp://x\" is not an http:// or https:// URL",
		"sink.kinesis.access_key_id is set without sink.kinesis.secret_access_key; set it, or sink.kinesis.secret_access_key_file",
		"sink.kinesis.max_requests is -1",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
	c := &Config{}
	if err := c.CheckFormat(relay.FormatCloudEventsBinary); err == nil || !strings.Contains(err.Error(), "a Kinesis record carries none") {
		t.Errorf("CheckFormat(cloudevents-binary): %v", err)
	}
	if err := c.CheckFormat(relay.FormatEnvelope); err != nil {
		t.Errorf("CheckFormat(envelope): %v", err)
	}
}

// TestStaticCredentials: static credentials with a session token are the
// client's, as for the other AWS sinks.
func TestStaticCredentials(t *testing.T) {
	cfg := testConfig("127.0.0.1:1", "orders")
	cfg.SessionToken = "session-token"
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	creds, err := s.client.Options().Credentials.Retrieve(context.Background())
	if err != nil || creds.AccessKeyID != "test" || creds.SecretAccessKey != "test" || creds.SessionToken != "session-token" {
		t.Errorf("credentials %+v, %v; want test, test and the session token", creds, err)
	}
}

// TestMissingStreamRefused: with a stream template, a message whose
// stream does not exist is refused (relay.Permanent, with the stream and
// the settings to check), so the relay dead-letters it after
// relay.max_attempts; the messages of a stream that exists are put, and
// the sink stays ready. Before, the refusal was retryable, and the relay
// retried such a message forever.
func TestMissingStreamRefused(t *testing.T) {
	srv := startKinesalite(t)
	c := testClient(t, srv.Addr())
	createStream(t, c, "orders", 1)
	s := startSink(t, testConfig(srv.Addr(), "{aggregate_type}"))
	good := sinktest.Messages("orders", 20, 2)
	ghost := sinktest.Messages("ghosts", 6, 2)
	msgs := append(append([]*relay.Message(nil), good...), ghost...)
	tr := sinktest.NewTracker(msgs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range msgs {
		s.Publish(ctx, m, tr.Done)
	}
	tr.Wait(ctx, t)
	refused := 0
	for i, m := range msgs {
		err := tr.Err(i)
		if m.AggregateType == "orders" {
			if err != nil {
				t.Errorf("message %s of stream orders: %v", m.ID, err)
			}
			continue
		}
		if err == nil || relay.Retryable(err) || !strings.Contains(err.Error(), "kinesis stream ghosts does not exist in us-east-1") ||
			!strings.Contains(err.Error(), "sink.kinesis.stream") {
			t.Errorf("message %s of the missing stream ghosts: %v (retryable %v), want a refusal naming the stream and sink.kinesis.stream", m.ID, err, err != nil && relay.Retryable(err))
			continue
		}
		refused++
	}
	got := sinktest.ReceiveAll(ctx, t, newConsumer(t, c, "orders"), good)
	sinktest.CheckOrder(t, good, got)
	t.Logf("%d messages of stream orders put, %d of the missing stream ghosts refused; ready %v", len(got), refused, s.Ready())
	if !s.Ready() {
		t.Error("Ready() = false after Kinesis answered that a stream does not exist")
	}
}
