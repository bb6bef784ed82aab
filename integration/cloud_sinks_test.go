package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The Pub/Sub and Kinesis sinks end to end through the relay binary: a
// broker that fails about 30% of publishes, a kill -9 of the relay
// mid-way, and a ledger of what reached the broker.

// cloudLedger inserts rows on 4 aggregates in 3 rounds, and 2 a round on
// the aggregate refused (the broker refuses its messages), kills the
// relay once about half of them are in, inserts 3 more rounds, restarts
// it and waits for every row of the 4; delivered reads what the broker
// holds, in its order. It returns the relay still running.
func cloudLedger(t *testing.T, e *env, sinkType, sinkYAML, refused string, delivered func() []delivered) (p *proc, ids map[string][]string, refusedIDs []string, got []delivered) {
	t.Helper()
	ids = map[string][]string{}
	aggs := []string{"1", "2", "3", "4"}
	insert := func(rounds int) {
		for range rounds {
			for _, agg := range aggs {
				ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, 20)...)
			}
			refusedIDs = append(refusedIDs, e.insert("public.outbox", "order", refused, 2)...)
		}
	}
	distinct := func() int {
		seen := map[string]bool{}
		for _, d := range delivered() {
			seen[d.id] = true
		}
		return len(seen)
	}
	wait := func(n int, d time.Duration) {
		deadline := time.Now().Add(d)
		for distinct() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d rows delivered within %s", distinct(), n, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The waits are generous: the emulators answer slowly on a loaded
	// machine (a Kinesis put times out after 500 ms), and only what
	// arrives is asserted, never how fast.
	p = e.startSinkRelay(sinkType, sinkYAML)
	insert(3)
	wait(120, 3*time.Minute)
	p.kill()
	if atKill, first := distinct(), 3*20*len(aggs); atKill >= first {
		t.Errorf("the kill came after all %d rows of the first run were delivered (%d): it tested no crash mid-way", first, atKill)
	}
	insert(3)
	p = e.startSinkRelay(sinkType, sinkYAML)
	wait(6*20*len(aggs), 3*time.Minute)
	return p, ids, refusedIDs, delivered()
}

// checkRefused waits until every row of the aggregate refused is a dead
// letter whose error contains reason or is parked behind one, and fails t
// unless that is so with at least one dead letter; it returns the counts.
func checkRefused(t *testing.T, e *env, refused []string, reason string) (letters, withReason, parked int) {
	t.Helper()
	agg := ""
	if err := e.db.QueryRow(t.Context(), "SELECT aggregate_id FROM outbox WHERE id = $1", refused[0]).Scan(&agg); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err := e.db.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE strpos(error, $2) > 0)
			FROM outboxrelay.dead_letters WHERE aggregate_id = $1`, agg, reason).Scan(&letters, &withReason); err != nil {
			t.Fatal(err)
		}
		if err := e.db.QueryRow(t.Context(), `SELECT count(DISTINCT message_id) FROM outboxrelay.parked WHERE aggregate_id = $1`, agg).Scan(&parked); err != nil {
			t.Fatal(err)
		}
		if letters+parked >= len(refused) || time.Now().After(deadline) {
			break
		}
	}
	if letters < 1 || withReason != letters || letters+parked != len(refused) {
		t.Errorf("refused aggregate: %d dead letters (%d with %q) and %d parked, want %d in all, each letter with the reason", letters, withReason, reason, parked, len(refused))
	}
	return letters, withReason, parked
}

// ledgerFigures checks and logs the ledger: lost rows, duplicates, and the
// per-aggregate first-arrival order.
func ledgerFigures(t *testing.T, ids map[string][]string, got []delivered) (rows, lost, dups int) {
	t.Helper()
	checkCommitOrder(t, ids, got)
	seen := map[string]bool{}
	for _, d := range got {
		if seen[d.id] {
			dups++
		}
		seen[d.id] = true
	}
	for _, list := range ids {
		rows += len(list)
		for _, id := range list {
			if !seen[id] {
				lost++
			}
		}
	}
	if lost != 0 {
		t.Errorf("%d rows lost", lost)
	}
	return rows, lost, dups
}

func decodeEnvelope(t *testing.T, data []byte) map[string]any {
	var env map[string]any
	if err := json.Unmarshal(data, &env); err != nil {
		t.Errorf("record is not a JSON envelope: %v: %.100q", err, data)
	}
	return env
}

// pubsubFaults fails about 30% of Publish calls: half with Unavailable,
// which the client retries itself, half with FailedPrecondition, which
// reaches the sink and pauses the aggregate's ordering key until the
// relay's retry resumes it. Every publish of the ordering key refused
// fails with InvalidArgument, which the sink takes as permanent.
type pubsubFaults struct {
	calls, unavailable, precondition, refused atomic.Int64
}

func (f *pubsubFaults) React(req any) (bool, any, error) {
	if r, ok := req.(*pubsubpb.PublishRequest); ok && len(r.Messages) > 0 && r.Messages[0].OrderingKey == "refused" {
		f.refused.Add(1)
		return true, nil, status.Error(codes.InvalidArgument, "injected: aggregate refused is closed")
	}
	switch n := f.calls.Add(1); {
	case n%20 == 3 || n%20 == 9 || n%20 == 15:
		f.unavailable.Add(1)
		return true, nil, status.Error(codes.Unavailable, "injected: unavailable")
	case n%20 == 6 || n%20 == 12 || n%20 == 18:
		f.precondition.Add(1)
		return true, nil, status.Error(codes.FailedPrecondition, "injected: failed precondition")
	}
	return false, nil, nil
}

func TestPubSubEndToEnd(t *testing.T) {
	e := newEnv(t)
	faults := &pubsubFaults{}
	srv := pstest.NewServerWithPort(0, pstest.ServerReactorOption{FuncName: "Publish", Reactor: faults})
	t.Cleanup(func() { srv.Close() })
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr) // the relay binary inherits it
	client, err := pubsub.NewClient(t.Context(), "outboxrelay-e2e")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	topic := "projects/outboxrelay-e2e/topics/e2e-order"
	if _, err := client.TopicAdminClient.CreateTopic(t.Context(), &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	sinkYAML := "  pubsub:\n    project: outboxrelay-e2e\n    topic: \"e2e-{aggregate_type}\"\n    timeout: 2s\n"
	read := func() []delivered {
		var got []delivered
		for _, m := range srv.Messages() {
			if m.Topic == topic {
				got = append(got, delivered{id: m.Attributes["message_id"], key: m.OrderingKey, env: decodeEnvelope(t, m.Data)})
			}
		}
		return got
	}
	sinkYAML += "relay:\n  max_attempts: 2\n"
	p, ids, refused, got := cloudLedger(t, e, "pubsub", sinkYAML, "refused", read)
	letters, _, parked := checkRefused(t, e, refused, "InvalidArgument")
	p.stop()
	for _, d := range read() {
		if d.key == "refused" {
			t.Errorf("refused message %s reached the topic", d.id)
		}
	}
	rows, lost, dups := ledgerFigures(t, ids, got)
	for _, d := range got {
		if d.key != d.env["aggregate_id"] {
			t.Errorf("message %s: ordering key %q, want its aggregate_id %v", d.id, d.key, d.env["aggregate_id"])
			break
		}
	}
	u, pre := faults.unavailable.Load(), faults.precondition.Load()
	t.Logf("ledger: %d rows (+%d refused), 1 kill -9, %d Publish calls, faults: %d unavailable, %d failed precondition, %d InvalidArgument; %d lost, %d duplicates, per-aggregate order checked; %d dead letters with the reason, %d parked",
		rows, len(refused), faults.calls.Load(), u, pre, faults.refused.Load(), lost, dups, letters, parked)
	if u < 3 || pre < 3 {
		t.Errorf("faults injected: %d unavailable, %d failed precondition; want at least 3 each", u, pre)
	}

	verifyCfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\nsink:\n  type: pubsub\n%s", e.dbURL, sinkYAML))
	if out, code := e.cli("verify", "--config", verifyCfg, "--since", "1h"); code != 2 || !strings.Contains(out, "a pubsub topic cannot be read back") {
		t.Errorf("verify with the pubsub sink: exit %d, %s; want exit 2 and the refusal", code, out)
	}
}

// kinesisFaults is an HTTP proxy in front of kinesalite that fails about
// 30% of requests: a 500 without forwarding, a hang past the sink's
// timeout, or forwarding and then dropping the answer (the records are in
// the stream, the sink does not know: duplicates).
type kinesisFaults struct {
	requests, refused, hung, dropped atomic.Int64
	proxy                            *httputil.ReverseProxy
	quit                             chan struct{}
}

func (f *kinesisFaults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".PutRecords") { // the start probe goes through
		f.proxy.ServeHTTP(w, r)
		return
	}
	f.requests.Add(1)
	switch rand.IntN(10) {
	case 0, 1:
		f.refused.Add(1)
		http.Error(w, `{"__type":"InternalFailure","message":"injected"}`, http.StatusInternalServerError)
	case 2:
		f.hung.Add(1)
		select {
		case <-time.After(3 * time.Second):
		case <-f.quit:
		}
	default:
		rec := httptest.NewRecorder()
		f.proxy.ServeHTTP(rec, r)
		if rand.IntN(7) == 0 {
			f.dropped.Add(1)
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}
}

// startKinesalite runs kinesalite 3.3.3 from the interop folder
// (.ci/interop-deps); missing, it skips the test, and fails it under CI=true.
func startKinesalite(t *testing.T) string {
	dir := os.Getenv("OUTBOXRELAY_TEST_INTEROP_DIR")
	if dir == "" {
		c, _ := os.UserCacheDir()
		dir = filepath.Join(c, "outboxrelay", "interop")
	}
	bin := filepath.Join(dir, "node_modules", ".bin", "kinesalite")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kinesalite is not installed (run .ci/interop-deps): %v", err)
		}
		t.Skipf("kinesalite is not installed (run .ci/interop-deps): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--createStreamMs", "0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("kinesalite did not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kinesisReader returns a function that reads what every shard of stream
// holds beyond what it read before, and returns all it has read, in
// order per shard.
func kinesisReader(t *testing.T, kc *kinesis.Client, stream string) func() []delivered {
	t.Helper()
	shards, err := kc.ListShards(t.Context(), &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []delivered
	iters := map[string]*string{}
	return func() []delivered {
		mu.Lock()
		defer mu.Unlock()
		for _, sh := range shards.Shards {
			id := aws.ToString(sh.ShardId)
			if iters[id] == nil {
				it, err := kc.GetShardIterator(context.Background(), &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
				if err != nil {
					t.Fatal(err)
				}
				iters[id] = it.ShardIterator
			}
			for {
				out, err := kc.GetRecords(context.Background(), &kinesis.GetRecordsInput{ShardIterator: iters[id]})
				if err != nil {
					t.Fatal(err)
				}
				iters[id] = out.NextShardIterator
				for _, r := range out.Records {
					env := decodeEnvelope(t, r.Data)
					got = append(got, delivered{id: fmt.Sprint(env["message_id"]), key: aws.ToString(r.PartitionKey), env: env})
				}
				if len(out.Records) == 0 {
					break
				}
			}
		}
		return append([]delivered(nil), got...)
	}
}

func TestKinesisEndToEnd(t *testing.T) {
	e := newEnv(t)
	addr := startKinesalite(t)
	target, _ := url.Parse("http://" + addr)
	faults := &kinesisFaults{proxy: httputil.NewSingleHostReverseProxy(target), quit: make(chan struct{})}
	front := httptest.NewServer(faults)
	t.Cleanup(func() { close(faults.quit); front.Close() })

	awsCfg, err := awsconfig.LoadDefaultConfig(t.Context(), awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	if err != nil {
		t.Fatal(err)
	}
	kc := kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://" + addr) })
	if _, err := kc.CreateStream(t.Context(), &kinesis.CreateStreamInput{StreamName: aws.String("e2e-order"), ShardCount: aws.Int32(2)}); err != nil {
		t.Fatal(err)
	}
	if err := kinesis.NewStreamExistsWaiter(kc).Wait(t.Context(), &kinesis.DescribeStreamInput{StreamName: aws.String("e2e-order")}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	read := kinesisReader(t, kc, "e2e-order")
	sinkYAML := fmt.Sprintf("  kinesis:\n    stream: \"e2e-{aggregate_type}\"\n    region: us-east-1\n    endpoint: %s\n    access_key_id: test\n    secret_access_key: test\n    timeout: 500ms\n", front.URL)
	// The refused aggregate's id is longer than a partition key may be.
	p, ids, refused, _ := cloudLedger(t, e, "kinesis", sinkYAML, strings.Repeat("k", 300), read)
	letters, _, parked := checkRefused(t, e, refused, "a Kinesis partition key takes at most 256")
	p.stop()
	// The ledger is the stream once the relay stopped: a put retried after
	// the last row arrived can still add a duplicate, which verify counts.
	rows, lost, dups := ledgerFigures(t, ids, read())
	req, ref, hung, drop := faults.requests.Load(), faults.refused.Load(), faults.hung.Load(), faults.dropped.Load()
	t.Logf("ledger: %d rows (+%d refused), 1 kill -9, %d PutRecords calls through the proxy, faults: %d answered 500, %d hung past the timeout, %d answers dropped after the put; %d lost, %d duplicates, per-aggregate order checked; %d dead letters with the reason, %d parked",
		rows, len(refused), req, ref, hung, drop, lost, dups, letters, parked)
	if ref < 3 || hung < 1 || drop < 1 {
		t.Errorf("faults injected: %d 500s, %d hangs, %d dropped answers; want at least 3, 1 and 1", ref, hung, drop)
	}

	// verify reads the stream back through the same faulty front (only
	// PutRecords fails there): every row found, the duplicates the
	// dropped answers caused counted as the ledger counted them, the
	// refused aggregate's rows dead-lettered or parked.
	verifyCfg := e.writeConfig(fmt.Sprintf("postgres:\n  url: %s\nsink:\n  type: kinesis\n%s", e.dbURL, sinkYAML))
	out, code := e.cli("verify", "--config", verifyCfg, "--since", "1h")
	t.Logf("verify:\n%s", out)
	for _, want := range []string{
		fmt.Sprintf("committed      %d\n", rows+len(refused)), fmt.Sprintf("found          %d\n", rows), "missing        0\n",
		fmt.Sprintf("duplicates     %d\n", dups), fmt.Sprintf("dead-lettered  %d\n", letters), fmt.Sprintf("parked         %d\n", parked),
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("verify with the kinesis sink: exit %d, want 0 and %q", code, strings.TrimSpace(want))
		}
	}
	// A row committed while no relay runs is reported missing, by id.
	lostID := e.insert("public.outbox", "order", "1", 1)
	out, code = e.cli("verify", "--config", verifyCfg, "--since", "1h")
	if code != 1 || !sameSet(missingIDs(out), lostID) || !strings.Contains(out, "missing        1\n") {
		t.Errorf("verify after a row the relay never saw: exit %d, missing %v; want exit 1 and exactly %v\n%s", code, missingIDs(out), lostID, out)
	}
}

// TestCloudSinksBadInput: for pubsub and kinesis, an unreachable service,
// an invalid template and missing credentials are each one clear error at
// start, exit 2, and no slot is created.
func TestCloudSinksBadInput(t *testing.T) {
	e := newEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	noAWS := []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_PROFILE=", "AWS_EC2_METADATA_DISABLED=true",
		"AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_CONFIG_FILE=/nonexistent"}
	for _, c := range []struct {
		name, sink string
		env        []string
		want       string
	}{
		{"pubsub unreachable", "  type: pubsub\n  pubsub:\n    project: p\n    topic: orders\n    timeout: 1s",
			[]string{"PUBSUB_EMULATOR_HOST=" + closed}, "cannot reach pubsub for projects/p/topics/orders"},
		{"pubsub template", "  type: pubsub\n  pubsub:\n    project: p\n    topic: \"{aggregatetype}\"",
			nil, "sink.pubsub.topic: topic template \"{aggregatetype}\" has unknown placeholder {aggregatetype}"},
		{"pubsub credentials", "  type: pubsub\n  pubsub:\n    project: p\n    topic: orders",
			[]string{"PUBSUB_EMULATOR_HOST=", "GOOGLE_APPLICATION_CREDENTIALS=", "HOME=" + t.TempDir()}, "no Google credentials to publish with"},
		{"kinesis unreachable", "  type: kinesis\n  kinesis:\n    stream: orders\n    region: us-east-1\n    endpoint: http://" + closed + "\n    access_key_id: a\n    secret_access_key: b\n    timeout: 1s",
			nil, "cannot reach kinesis for orders"},
		{"kinesis template", "  type: kinesis\n  kinesis:\n    stream: \"{aggregatetype}\"\n    region: us-east-1",
			nil, "sink.kinesis.stream: stream template \"{aggregatetype}\" has unknown placeholder {aggregatetype}"},
		{"kinesis credentials", "  type: kinesis\n  kinesis:\n    stream: orders\n    region: us-east-1\n    endpoint: http://" + closed + "\n    timeout: 2s",
			noAWS, "no AWS credentials to put records with"},
		{"kinesis format", "  type: kinesis\n  kinesis:\n    stream: orders\n    region: us-east-1\nenvelope:\n  format: cloudevents-binary",
			nil, "a Kinesis record carries none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, kv := range c.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			slot := "cloud_bad_" + strings.ReplaceAll(c.name, " ", "_")
			cfg := fmt.Sprintf("postgres:\n  url: %s\n  slot: %s\nsink:\n%s\nhttp:\n  listen: 127.0.0.1:0\n", e.dbURL, slot, c.sink)
			out, code := e.cliConfig(cfg)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			t.Logf("exit %d: %s", code, last)
			if code != 2 || !strings.Contains(last, c.want) {
				t.Errorf("exit %d, last line %q; want exit 2 and %q\n%s", code, last, c.want, out)
			}
			var plain []string
			for _, l := range lines {
				if !strings.HasPrefix(l, "{") { // the relay's log lines are JSON
					plain = append(plain, l)
				}
			}
			if len(plain) != 1 {
				t.Errorf("%d lines of error, want one:\n%s", len(plain), strings.Join(plain, "\n"))
			}
			var exists bool
			if err := e.db.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if exists {
				t.Errorf("slot %s was created by a start that failed", slot)
			}
		})
	}
}

// TestKinesisMissingStream: with the stream template e2e-{aggregate_type},
// rows whose stream does not exist are dead-lettered with the reason after
// relay.max_attempts refusals (or parked behind their aggregate's dead
// letter), while the rows of a stream that exists all arrive, once, in
// order. Before, the relay retried them forever, with no dead letter. A
// stream name without a placeholder that does not exist is one error at
// start, exit 2, and no slot.
func TestKinesisMissingStream(t *testing.T) {
	e := newEnv(t)
	addr := startKinesalite(t)
	awsCfg, err := awsconfig.LoadDefaultConfig(t.Context(), awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	if err != nil {
		t.Fatal(err)
	}
	kc := kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://" + addr) })
	if _, err := kc.CreateStream(t.Context(), &kinesis.CreateStreamInput{StreamName: aws.String("e2e-order"), ShardCount: aws.Int32(2)}); err != nil {
		t.Fatal(err)
	}
	if err := kinesis.NewStreamExistsWaiter(kc).Wait(t.Context(), &kinesis.DescribeStreamInput{StreamName: aws.String("e2e-order")}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	read := kinesisReader(t, kc, "e2e-order")
	sinkYAML := func(stream string) string {
		return fmt.Sprintf("  kinesis:\n    stream: %q\n    region: us-east-1\n    endpoint: http://%s\n    access_key_id: test\n    secret_access_key: test\n    timeout: 2s\nrelay:\n  max_attempts: 3", stream, addr)
	}

	t.Run("static stream", func(t *testing.T) {
		slot := "kinesis_absent"
		cfg := fmt.Sprintf("postgres:\n  url: %s\n  slot: %s\nsink:\n  type: kinesis\n%s\nhttp:\n  listen: 127.0.0.1:0\n", e.dbURL, slot, sinkYAML("e2e-absent"))
		out, code := e.cliConfig(cfg)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		t.Logf("exit %d: %s", code, last)
		if code != 2 || !strings.Contains(last, "kinesis stream e2e-absent does not exist in us-east-1; create it, or check sink.kinesis.stream") {
			t.Errorf("exit %d, last line %q; want exit 2 and the missing stream named\n%s", code, last, out)
		}
		var exists bool
		if err := e.db.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			t.Errorf("slot %s was created by a start that failed", slot)
		}
	})

	p := e.startSinkRelay("kinesis", sinkYAML("e2e-{aggregate_type}"))
	ids := map[string][]string{}
	var ghosts []string
	for range 3 {
		for _, agg := range []string{"1", "2", "3"} {
			ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, 10)...)
		}
		ghosts = append(ghosts, e.insert("public.outbox", "ghost", "g", 2)...)
	}
	want := 0
	for _, list := range ids {
		want += len(list)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		seen := map[string]bool{}
		for _, d := range read() {
			seen[d.id] = true
		}
		if len(seen) >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows of stream e2e-order delivered within 2m\n%s", len(seen), want, tail(p.out.String(), 30))
		}
	}
	letters, withReason, parked := checkRefused(t, e, ghosts, "kinesis stream e2e-ghost does not exist in us-east-1")
	rows, lost, dups := ledgerFigures(t, ids, read())
	view := e.operatorView(p)
	t.Logf("ledger: %d rows to e2e-order, %d to the missing e2e-ghost; %d lost, %d duplicates, per-aggregate order checked; %d dead letters (%d with the reason), %d parked; %s",
		rows, len(ghosts), lost, dups, letters, withReason, parked, view)
	if dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	if !strings.Contains(view, "/readyz 200") {
		t.Errorf("after the refusals: %s, want the relay ready", view)
	}
	p.stop()
}
