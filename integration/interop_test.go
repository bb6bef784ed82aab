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
)

// Stock clients that nobody here wrote read what the relay publishes:
// kafkajs and the CloudEvents JavaScript SDK (installed by .ci/interop-deps
// into a cache folder) and kcat (Debian's kcat). Each is run at its default
// settings. When CI=true a missing client fails the test.

// interopNodeModules returns the node_modules folder .ci/interop-deps
// filled, or skips (fails under CI) when it or node is missing.
func interopNodeModules(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("OUTBOXRELAY_TEST_INTEROP_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			missingClient(t, "the user cache folder", err.Error())
		}
		dir = filepath.Join(cache, "outboxrelay", "interop")
	}
	mods := filepath.Join(dir, "node_modules")
	if _, err := exec.LookPath("node"); err != nil {
		missingClient(t, "node", "install Debian's nodejs package")
	}
	for _, pkg := range []string{"kafkajs", "cloudevents"} {
		if _, err := os.Stat(filepath.Join(mods, pkg, "package.json")); err != nil {
			missingClient(t, "npm package "+pkg, "run .ci/interop-deps (it installs into "+dir+")")
		}
	}
	return mods
}

func missingClient(t *testing.T, what, fix string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing: %s; CI must install it before the tests (see .ci/services)", what, fix)
	}
	t.Skipf("%s is missing: %s; set CI=true to make this a failure", what, fix)
}

// jsRecord is one record as kafka-read.js printed it.
type jsRecord struct {
	Topic           string              `json:"topic"`
	Partition       int                 `json:"partition"`
	Key             *string             `json:"key"`
	Headers         map[string][]string `json:"headers"`
	Value           string              `json:"value"`
	CloudEvent      map[string]any      `json:"cloudevent"`
	CloudEventError string              `json:"cloudeventError"`
	Decoded         map[string]any      `json:"decoded"`
	DecodeError     string              `json:"decodeError"`
	Crash           string              `json:"crash"`
	Message         string              `json:"message"`
}

// kafkajsRead runs kafka-read.js against the test's broker and returns what
// it printed and its exit code.
func (e *env) kafkajsRead(mods, topic string, n int, args ...string) ([]jsRecord, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"interop/kafka-read.js", e.brokers, topic, fmt.Sprint(n)}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("node kafka-read.js: %v", err)
	}
	var recs []jsRecord
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r jsRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			e.t.Fatalf("kafka-read.js printed %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	if code != 0 && code != 3 {
		e.t.Fatalf("kafka-read.js exited %d\nstderr: %s\nstdout: %s", code, stderr.String(), stdout.String())
	}
	return recs, code
}

// interopRows commits rows for three aggregates in several transactions,
// each with a tenant header and a traceparent, and returns the ids per
// aggregate in commit order.
func (e *env) interopRows(perAggregate int) map[string][]string {
	e.t.Helper()
	ids := map[string][]string{}
	for i := 0; i < perAggregate; i++ {
		tx, err := e.db.Begin(e.t.Context())
		if err != nil {
			e.t.Fatal(err)
		}
		for _, agg := range []string{"1", "2", "3"} {
			var id string
			tp := fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e47%02d-00f067aa0ba902b7-01", i%100)
			if err := tx.QueryRow(e.t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, traceparent)
				VALUES ('order', $1, 'order.created', jsonb_build_object('seq', $2::int), '{"tenant": "acme"}', $3) RETURNING id::text`,
				agg, i, tp).Scan(&id); err != nil {
				e.t.Fatal(err)
			}
			ids[agg] = append(ids[agg], id)
		}
		if err := tx.Commit(e.t.Context()); err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

func one(t *testing.T, r jsRecord, name string) string {
	t.Helper()
	vs := r.Headers[name]
	if len(vs) != 1 {
		t.Errorf("record %v: header %s has %d values %q, want exactly one", r.Headers["message_id"], name, len(vs), vs)
		return ""
	}
	return vs[0]
}

// TestKafkajsReadsDefaultCompression: with no compression setting, kafkajs
// (which has no snappy, lz4 or zstd codec without plugins) reads every
// committed row once, in commit order per aggregate, with single-valued
// headers and an envelope that parses.
func TestKafkajsReadsDefaultCompression(t *testing.T) {
	mods := interopNodeModules(t)
	e := newEnv(t)
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.interopRows(10)
	recs, code := e.kafkajsRead(mods, "outbox.order", 30)
	p.stop()
	if code != 0 {
		t.Fatalf("kafkajs crashed: %s: %s", recs[len(recs)-1].Crash, recs[len(recs)-1].Message)
	}
	var got []delivered
	for _, r := range recs {
		id := one(t, r, "message_id")
		d := delivered{id: id}
		if r.Key != nil {
			d.key = *r.Key
		}
		if err := json.Unmarshal([]byte(r.Value), &d.env); err != nil {
			t.Fatalf("record %s: value is not JSON: %v", id, err)
		}
		if d.env["envelope_version"] != float64(1) || d.env["aggregate_id"] != d.key {
			t.Errorf("record %s: envelope %v, key %q", id, d.env, d.key)
		}
		if ct := one(t, r, "content-type"); ct != "application/json" {
			t.Errorf("record %s: content-type %q", id, ct)
		}
		if et := one(t, r, "event_type"); et != "order.created" {
			t.Errorf("record %s: event_type %q", id, et)
		}
		if tp := one(t, r, "traceparent"); !strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e47") {
			t.Errorf("record %s: traceparent %q", id, tp)
		}
		if one(t, r, "tenant") != "acme" {
			t.Errorf("record %s: tenant header %q", id, r.Headers["tenant"])
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}

// TestKafkajsSnappyNeedsPlugin documents why snappy is not the default: the
// configuration accepts sink.kafka.compression: snappy, the broker takes the
// records, and kafkajs without a codec plugin cannot read them. If kafkajs
// ever reads snappy by itself, this test fails and the README's consumer
// guide should say so.
func TestKafkajsSnappyNeedsPlugin(t *testing.T) {
	mods := interopNodeModules(t)
	e := newEnv(t)
	c := e.consume("outbox.order")
	p := e.start("OUTBOXRELAY_SINK_KAFKA_COMPRESSION=snappy")
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.insert("outbox", "order", "1", 3)
	c.waitIDs(ids, 30*time.Second) // franz-go reads them: they are there
	recs, code := e.kafkajsRead(mods, "outbox.order", len(ids))
	p.stop()
	if code != 3 || len(recs) == 0 {
		t.Fatalf("kafkajs exited %d with %d records; want a crash on the snappy batch", code, len(recs))
	}
	last := recs[len(recs)-1]
	if last.Crash != "KafkaJSNotImplemented" || !strings.Contains(last.Message, "Snappy") {
		t.Fatalf("kafkajs crashed with %s: %s; want KafkaJSNotImplemented for snappy", last.Crash, last.Message)
	}
	t.Logf("as documented, kafkajs without a plugin: %s: %s", last.Crash, last.Message)
}

// TestKcatReads: kcat (librdkafka) reads every committed row, with the
// default compression, its key, single-valued headers and the envelope.
func TestKcatReads(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		missingClient(t, "kcat", "apt-get install kcat (.ci/services does)")
	}
	e := newEnv(t)
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)
	ids := e.interopRows(5)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// -J: one JSON object per message, headers as a flat [name, value, ...]
	// list, so repeats stay visible.
	out, err := exec.CommandContext(ctx, kcat, "-C", "-J", "-q", "-b", e.brokers, "-t", "outbox.order",
		"-o", "beginning", "-c", "15").CombinedOutput()
	p.stop()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	var got []delivered
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m struct {
			Key     string   `json:"key"`
			Payload string   `json:"payload"`
			Headers []string `json:"headers"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("kcat printed %q: %v", line, err)
		}
		r := jsRecord{Headers: map[string][]string{}}
		for i := 0; i+1 < len(m.Headers); i += 2 {
			r.Headers[m.Headers[i]] = append(r.Headers[m.Headers[i]], m.Headers[i+1])
		}
		d := delivered{id: one(t, r, "message_id"), key: m.Key}
		if err := json.Unmarshal([]byte(m.Payload), &d.env); err != nil {
			t.Fatalf("record %s: payload is not JSON: %v", d.id, err)
		}
		if one(t, r, "content-type") != "application/json" || one(t, r, "tenant") != "acme" || d.env["aggregate_id"] != m.Key {
			t.Errorf("record %s: headers %v, key %q", d.id, r.Headers, m.Key)
		}
		got = append(got, d)
	}
	checkCommitOrder(t, ids, got)
}

// TestCloudEventsSDKReadsKafka: the CloudEvents JavaScript SDK's Kafka
// binding decodes and validates what the relay publishes in both content
// modes, from a row whose headers spoof the relay's own (it answered "No
// CloudEvent detected" when the row's content-type was sent as a second
// header).
func TestCloudEventsSDKReadsKafka(t *testing.T) {
	mods := interopNodeModules(t)
	for _, format := range []string{"cloudevents", "cloudevents-binary"} {
		t.Run(format, func(t *testing.T) {
			e := newEnv(t)
			p := e.start("OUTBOXRELAY_ENVELOPE_FORMAT="+format, "OUTBOXRELAY_ENVELOPE_SOURCE=/shop/orders")
			p.waitLog(`"streaming"`, 30*time.Second)
			ids := map[string]bool{}
			for _, agg := range []string{"1", "2"} {
				var id string
				if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, traceparent)
					VALUES ('order', $1, 'order.created', '{"order_id": 42}', $2, $3) RETURNING id::text`,
					agg, spoofHeaders, spoofRowTraceparent).Scan(&id); err != nil {
					t.Fatal(err)
				}
				ids[id] = true
			}
			recs, code := e.kafkajsRead(mods, "outbox.order", len(ids), "--cloudevents")
			p.stop()
			if code != 0 {
				t.Fatalf("kafkajs crashed: %+v", recs)
			}
			wantCT := map[string]string{"cloudevents": "application/cloudevents+json", "cloudevents-binary": "application/json"}[format]
			for _, r := range recs {
				if r.CloudEventError != "" {
					t.Fatalf("the CloudEvents SDK rejects the record: %s\nheaders %v\nvalue %s", r.CloudEventError, r.Headers, r.Value)
				}
				ev := r.CloudEvent
				id, _ := ev["id"].(string)
				if !ids[id] {
					t.Errorf("event id %q is not a committed row", id)
				}
				delete(ids, id)
				data, _ := ev["data"].(map[string]any)
				if ev["specversion"] != "1.0" || ev["source"] != "/shop/orders" || ev["type"] != "order.created" ||
					ev["subject"] != *r.Key || ev["traceparent"] != spoofRowTraceparent || data["order_id"] != float64(42) {
					t.Errorf("event %v", ev)
				}
				if ct := one(t, r, "content-type"); ct != wantCT {
					t.Errorf("event %s: content-type %q, want %q", id, ct, wantCT)
				}
				if one(t, r, "tenant") != "acme" {
					t.Errorf("event %s: tenant %q", id, r.Headers["tenant"])
				}
			}
			if len(ids) > 0 {
				t.Errorf("events missing: %v", ids)
			}
		})
	}
}
