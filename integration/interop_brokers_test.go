package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/integration/pgserver/pgservertest"
)

// Stock clients of the other three brokers read what the relay publishes
// through the relay binary: Python pika (Debian's python3-pika) from
// RabbitMQ, redis-cli (XRANGE) from Redis Streams, and the NATS CLI
// (natscli, built from the Go module proxy by .ci/interop-deps) from
// JetStream. Each runs at its default settings, and each check is the
// same: the key or subject, one value per relay-owned header carrying the
// relay's value, the row's tenant header, a JSON body, and against the
// ledger of committed rows none lost, per-aggregate commit order.

// checkInteropHeaders fails t unless hs (header name to every value that
// arrived) holds exactly one of each name in want, with that value.
func checkInteropHeaders(t *testing.T, id string, hs map[string][]string, want map[string]string) {
	t.Helper()
	for name, v := range want {
		if got := hs[name]; len(got) != 1 || (v != "*" && got[0] != v) {
			t.Errorf("message %s: header %s = %q, want exactly one %q", id, name, got, v)
		}
	}
}

// interopTraceparent reports whether tp is the traceparent interopRows wrote.
func interopTraceparent(tp string) bool {
	return strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e47") && strings.HasSuffix(tp, "-00f067aa0ba902b7-01")
}

// pikaPython returns a Python that imports pika, or skips (fails under CI).
func pikaPython(t *testing.T) string {
	t.Helper()
	return pythonImporting(t, "pika", "python3-pika")
}

// pythonImporting returns a Python that imports module (Debian's
// /usr/bin/python3 first: Debian's python3-* packages install there), or
// skips (fails under CI) naming the package that provides it.
func pythonImporting(t *testing.T, module, debPackage string) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import "+module).Run() == nil {
			return path
		}
	}
	missingClient(t, "Python "+module, "apt-get install "+debPackage+" (.ci/services does)")
	return ""
}

// TestPikaReadsRabbitMQ: pika reads every committed row from a queue bound
// to the relay's exchange: routing key {aggregate_type}.{event_type}
// (order.order%2Ecreated), the
// AMQP properties (message-id, type, content-type, persistent, app-id,
// timestamp), one aggregate_id, aggregate_type and traceparent header each,
// the tenant header, and the envelope as the body.
func TestPikaReadsRabbitMQ(t *testing.T) {
	py := pikaPython(t)
	pgservertest.RequireTCP(t, "127.0.0.1:5672", "RabbitMQ")
	name := fmt.Sprintf("interop-%s", extraID())
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
		conn.Close()
	})

	e := newEnv(t)
	p := e.start("OUTBOXRELAY_SINK_TYPE=rabbitmq", "OUTBOXRELAY_SINK_RABBITMQ_URL="+rabbitURL, "OUTBOXRELAY_SINK_RABBITMQ_EXCHANGE="+name)
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.interopRows(5)

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, py, "interop/amqp-read.py", name, "15")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	p.stop()
	if err != nil {
		t.Fatalf("amqp-read.py: %v\nstderr: %s\nstdout: %s", err, stderr.String(), out)
	}
	var got []delivered
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m struct {
			RoutingKey   string         `json:"routing_key"`
			MessageID    string         `json:"message_id"`
			Type         string         `json:"type"`
			ContentType  string         `json:"content_type"`
			DeliveryMode int            `json:"delivery_mode"`
			AppID        string         `json:"app_id"`
			Timestamp    int64          `json:"timestamp"`
			Headers      map[string]any `json:"headers"`
			Body         string         `json:"body"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("amqp-read.py printed %q: %v", sc.Text(), err)
		}
		d := delivered{id: m.MessageID, key: fmt.Sprint(m.Headers["aggregate_id"])}
		if err := json.Unmarshal([]byte(m.Body), &d.env); err != nil {
			t.Fatalf("message %s: body is not JSON: %v", m.MessageID, err)
		}
		// A template value is one routing-key word: the dot of the event
		// type is percent-encoded (README, Routing templates).
		if m.RoutingKey != "order.order%2Ecreated" || m.Type != "order.created" || m.ContentType != "application/json" ||
			m.DeliveryMode != 2 || m.AppID != "outboxrelay" || m.Timestamp == 0 {
			t.Errorf("message %s: routing key %q, type %q, content type %q, delivery mode %d, app id %q, timestamp %d",
				m.MessageID, m.RoutingKey, m.Type, m.ContentType, m.DeliveryMode, m.AppID, m.Timestamp)
		}
		// An AMQP table holds each name once; pika's dict shows the value
		// that arrived, and the relay-owned ones must be the relay's.
		if m.Headers["aggregate_type"] != "order" || m.Headers["tenant"] != "acme" ||
			!interopTraceparent(fmt.Sprint(m.Headers["traceparent"])) || d.env["aggregate_id"] != d.key {
			t.Errorf("message %s: headers %v", m.MessageID, m.Headers)
		}
		for _, k := range []string{"message_id", "event_type", "content-type"} {
			if _, ok := m.Headers[k]; ok {
				t.Errorf("message %s: header %s repeats a property: %v", m.MessageID, k, m.Headers)
			}
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}

// TestRedisCLIReadsStream: redis-cli XRANGE (its --json output, for an
// unambiguous parse) reads every committed row from the relay's stream,
// each entry with one message_id, event_type, aggregate_id, aggregate_type,
// traceparent and content-type field, the row's headers as a JSON object,
// and the envelope.
func TestRedisCLIReadsStream(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		missingClient(t, "redis-cli", "apt-get install redis-tools (.ci/services does)")
	}
	pgservertest.RequireTCP(t, "127.0.0.1:6379", "Redis")
	key := "outboxrelay-interop:" + extraID()
	t.Cleanup(func() { _ = exec.Command(cli, "DEL", key).Run() })
	e := newEnv(t)
	p := e.startSinkRelay("redis", fmt.Sprintf("  redis:\n    url: redis://127.0.0.1:6379/0\n    stream: %q\n", key))
	ids := e.interopRows(5)

	var entries [][]json.RawMessage
	waitFor(t, 30*time.Second, "15 entries in the stream", func() bool {
		out, err := exec.CommandContext(t.Context(), cli, "--json", "XRANGE", key, "-", "+").Output()
		if err != nil {
			t.Fatalf("redis-cli XRANGE: %v", err)
		}
		entries = nil
		if err := json.Unmarshal(out, &entries); err != nil {
			t.Fatalf("redis-cli printed %q: %v", out, err)
		}
		return len(entries) >= 15
	})
	p.stop()
	var got []delivered
	for _, entry := range entries {
		var fields []string
		if len(entry) != 2 || json.Unmarshal(entry[1], &fields) != nil {
			t.Fatalf("entry %s is not [id, [field, value, ...]]", entry)
		}
		hs := map[string][]string{}
		for i := 0; i+1 < len(fields); i += 2 {
			hs[fields[i]] = append(hs[fields[i]], fields[i+1])
		}
		id := strings.Join(hs["message_id"], ",")
		checkInteropHeaders(t, id, hs, map[string]string{
			"message_id": "*", "event_type": "order.created", "aggregate_id": "*", "aggregate_type": "order",
			"traceparent": "*", "content-type": "application/json", "headers": "*", "envelope": "*",
		})
		if len(hs["envelope"]) != 1 || len(hs["aggregate_id"]) != 1 {
			continue
		}
		d := delivered{id: id, key: hs["aggregate_id"][0]}
		if err := json.Unmarshal([]byte(hs["envelope"][0]), &d.env); err != nil {
			t.Fatalf("entry %s: envelope is not JSON: %v", id, err)
		}
		var rowHeaders map[string]string
		if err := json.Unmarshal([]byte(strings.Join(hs["headers"], "")), &rowHeaders); err != nil || rowHeaders["tenant"] != "acme" {
			t.Errorf("entry %s: headers field %q (%v)", id, hs["headers"], err)
		}
		if !interopTraceparent(strings.Join(hs["traceparent"], "")) {
			t.Errorf("entry %s: traceparent %q", id, hs["traceparent"])
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}

// natsCLI returns the nats command: NATS_CLI, the one on PATH, or the one
// .ci/interop-deps built into the interop cache folder; else it skips
// (fails under CI).
func natsCLI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NATS_CLI"); p != "" {
		return p
	}
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	dir := os.Getenv("OUTBOXRELAY_TEST_INTEROP_DIR")
	if dir == "" {
		if cache, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(cache, "outboxrelay", "interop")
		}
	}
	p := filepath.Join(dir, "bin", "nats")
	if _, err := os.Stat(p); err != nil {
		missingClient(t, "the nats CLI", "run .ci/interop-deps (it builds github.com/nats-io/natscli into "+filepath.Join(dir, "bin")+")")
	}
	return p
}

// TestNATSCLIReadsJetStream: the NATS CLI (nats sub --stream --all, an
// ordered JetStream consumer, its --dump files for an unambiguous parse)
// reads every committed row on the relay's subject, each with one
// Nats-Msg-Id, message_id, event_type, aggregate_id, aggregate_type,
// traceparent and content-type header, the tenant header, and the envelope.
func TestNATSCLIReadsJetStream(t *testing.T) {
	nats := natsCLI(t)
	pgservertest.RequireTCP(t, "127.0.0.1:4222", "nats-server with JetStream (nats-server -js)")
	id := extraID()
	stream, subject := "INTEROP_"+strings.ToUpper(id), "interop"+id
	t.Cleanup(func() {
		_ = exec.Command(nats, "--server", "nats://127.0.0.1:4222", "stream", "rm", stream, "--force").Run()
	})
	e := newEnv(t)
	p := e.startSinkRelay("nats", fmt.Sprintf("  nats:\n    url: nats://127.0.0.1:4222\n    subject: \"%s.{aggregate_type}\"\n    stream: %s\n    create_stream: true\n", subject, stream))
	ids := e.interopRows(5)

	dump := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, nats, "--server", "nats://127.0.0.1:4222", "sub", subject+".>",
		"--stream", stream, "--all", "--count", "15", "--dump", dump).CombinedOutput()
	p.stop()
	if err != nil {
		t.Fatalf("nats sub: %v\n%s", err, out)
	}
	var got []delivered
	for i := 1; i <= 15; i++ {
		b, err := os.ReadFile(filepath.Join(dump, fmt.Sprintf("%d.json", i)))
		if err != nil {
			t.Fatalf("nats sub wrote no message %d: %v\n%s", i, err, out)
		}
		var m struct {
			Subject string
			Header  map[string][]string
			Data    []byte // base64 in the dump
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("dump %d: %v\n%s", i, err, b)
		}
		msgID := strings.Join(m.Header["message_id"], ",")
		checkInteropHeaders(t, msgID, m.Header, map[string]string{
			"Nats-Msg-Id": msgID, "message_id": "*", "event_type": "order.created", "aggregate_id": "*",
			"aggregate_type": "order", "traceparent": "*", "content-type": "application/json", "tenant": "acme",
		})
		if m.Subject != subject+".order" || !interopTraceparent(strings.Join(m.Header["traceparent"], "")) {
			t.Errorf("message %s: subject %q, traceparent %q", msgID, m.Subject, m.Header["traceparent"])
		}
		d := delivered{id: msgID, key: strings.Join(m.Header["aggregate_id"], ",")}
		if err := json.Unmarshal(m.Data, &d.env); err != nil {
			t.Fatalf("message %s: data %q is not JSON: %v", msgID, m.Data, err)
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}
