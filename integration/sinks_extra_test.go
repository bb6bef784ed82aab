package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// End to end through the relay binary for the NATS JetStream and Redis
// Streams sinks: rows committed in PostgreSQL arrive once per message id
// (NATS, across a kill -9 of the relay) or at least once (Redis), in commit
// order per aggregate.

func extraID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startSinkRelay starts the relay with sinkYAML as its sink section. A relay
// that exits before streaming (a sink type the binary does not know
// included) fails the test.
func (e *env) startSinkRelay(sinkType, sinkYAML string) *proc {
	e.t.Helper()
	cfg := fmt.Sprintf(`postgres:
  url: %s
  status_interval: 200ms
sink:
  type: %s
%s
http:
  listen: 127.0.0.1:0
log:
  level: debug
`, e.dbURL, sinkType, sinkYAML)
	path := filepath.Join(e.t.TempDir(), "outboxrelay.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(relayBin, "run", "--config", path)
	cmd.Env = cleanEnv()
	p := &proc{t: e.t, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if e.t.Failed() {
			e.t.Logf("relay output:\n%s", tail(p.out.String(), 60))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.out.String(), `"streaming"`) {
		select {
		case <-p.done:
			e.t.Fatalf("relay exited (%v) before streaming\n%s", p.err, tail(p.out.String(), 40))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("relay did not start streaming within 30s\n%s", tail(p.out.String(), 40))
		}
	}
	return p
}

// delivered is one broker message as the e2e checks see it.
type delivered struct {
	id, key string
	env     map[string]any
}

// checkCommitOrder fails t unless, ignoring repeats, every aggregate's
// messages arrived in the order of ids (the commit order), each carrying
// its id in the envelope.
func checkCommitOrder(t *testing.T, ids map[string][]string, got []delivered) {
	t.Helper()
	pos := map[string]int{}
	for _, list := range ids {
		for i, id := range list {
			pos[id] = i
		}
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, d := range got {
		if seen[d.id] {
			continue
		}
		seen[d.id] = true
		if d.env["message_id"] != d.id {
			t.Errorf("message %s: envelope message_id %v", d.id, d.env["message_id"])
		}
		p, ok := pos[d.id]
		if !ok {
			t.Errorf("unexpected message %s", d.id)
			continue
		}
		if prev, ok := last[d.key]; ok && prev > p {
			t.Errorf("aggregate %s: message #%d arrived after #%d", d.key, p, prev)
		}
		last[d.key] = p
	}
	if len(seen) != len(pos) {
		t.Errorf("received %d distinct messages, want %d", len(seen), len(pos))
	}
}

func TestNATSEndToEnd(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:4222", "nats-server with JetStream (nats-server -js)")
	e := newEnv(t)
	id := extraID()
	stream, prefix := "E2E_"+strings.ToUpper(id), "e2e"+id
	nc, err := natsgo.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	sinkYAML := fmt.Sprintf(`  nats:
    url: nats://127.0.0.1:4222
    subject: "%s.{aggregate_type}.{event_type}"
    stream: %s
    create_stream: true`, prefix, stream)

	p := e.startSinkRelay("nats", sinkYAML)
	ids := map[string][]string{}
	insert := func(rounds int) {
		for r := 0; r < rounds; r++ {
			for _, agg := range []string{"1", "2", "3"} {
				ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, 50)...)
			}
		}
	}
	insert(2)
	// Crash after the first messages are out: the restarted relay
	// publishes the unconfirmed ones again, and the stream's duplicate
	// window drops those it already stored.
	waitNATS(t, js, stream, 50)
	p.kill()
	insert(2)
	p = e.startSinkRelay("nats", sinkYAML)
	const total = 4 * 3 * 50
	waitNATS(t, js, stream, total)
	p.stop()
	t.Logf("the restarted relay published %d messages the stream already had", strings.Count(p.out.String(), "dropped the duplicate"))

	st, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Errorf("stream holds %d messages, want exactly %d", info.State.Msgs, total)
	}
	c, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(total, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []delivered
	for m := range batch.Messages() {
		d := delivered{id: m.Headers().Get("message_id"), key: m.Headers().Get("aggregate_id")}
		if err := json.Unmarshal(m.Data(), &d.env); err != nil {
			t.Fatalf("envelope is not JSON: %v", err)
		}
		if want := prefix + ".order.order%2Ecreated"; m.Subject() != want {
			t.Errorf("subject %q, want %q", m.Subject(), want)
		}
		if m.Headers().Get("Nats-Msg-Id") != d.id || m.Headers().Get("traceparent") == "" {
			t.Errorf("message %s: headers %v", d.id, m.Headers())
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}

func waitNATS(t *testing.T, js jetstream.JetStream, stream string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if st, err := js.Stream(t.Context(), stream); err == nil {
			if info, err := st.Info(t.Context()); err == nil && info.State.Msgs >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %s did not reach %d messages within 60s", stream, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRedisEndToEnd(t *testing.T) {
	pgservertest.RequireTCP(t, "127.0.0.1:6379", "Redis")
	e := newEnv(t)
	prefix := "outboxrelay-e2e:" + extraID() + ":"
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	key := prefix + "order"
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	sinkYAML := fmt.Sprintf(`  redis:
    url: redis://127.0.0.1:6379/0
    stream: "%s{aggregate_type}"
    max_len: 100000`, prefix)

	p := e.startSinkRelay("redis", sinkYAML)
	ids := map[string][]string{}
	for r := 0; r < 3; r++ {
		for _, agg := range []string{"1", "2", "3"} {
			ids[agg] = append(ids[agg], e.insert("public.outbox", "order", agg, 50)...)
		}
	}
	const total = 3 * 3 * 50
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := rdb.XLen(t.Context(), key).Result()
		if err == nil && n >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %s holds %d entries (%v), want %d", key, n, err, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()

	entries, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var got []delivered
	for _, x := range entries {
		d := delivered{id: fmt.Sprint(x.Values["message_id"]), key: fmt.Sprint(x.Values["aggregate_id"])}
		if err := json.Unmarshal([]byte(fmt.Sprint(x.Values["envelope"])), &d.env); err != nil {
			t.Fatalf("envelope is not JSON: %v", err)
		}
		if x.Values["event_type"] != "order.created" || x.Values["traceparent"] == "" {
			t.Errorf("entry %s: fields %v", x.ID, x.Values)
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}
