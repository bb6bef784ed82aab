package integration

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/outboxrelay/outboxrelay/sinks/kafka/srtest"
)

// The Confluent Schema Registry wire format (sink.kafka.value_format),
// against srtest's registry, which answers the registry's REST API: the
// relay's records decoded here and by Confluent's own JavaScript
// deserializer (@confluentinc/schemaregistry, installed by .ci/interop-deps, run by
// interop/kafka-read.js).

const (
	confluentJSONSchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "OrderCreated", "type": "object",
  "required": ["order_id"], "properties": {"order_id": {"type": "integer"}, "note": {"type": ["string", "null"]}}}`
	confluentAvroSchema = `{"type": "record", "name": "OrderCreated", "namespace": "shop", "fields": [
  {"name": "order_id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": null}]}`
)

// confluentSchemas writes the schema folder of order.created v1, both forms.
func confluentSchemas(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "order.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"v1.json": confluentJSONSchema, "v1.avsc": confluentAvroSchema} {
		if err := os.WriteFile(filepath.Join(dir, "order.created", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func confluentEnv(format, dir, registry string) []string {
	return []string{
		"OUTBOXRELAY_ENVELOPE_FORMAT=cloudevents-binary", "OUTBOXRELAY_ENVELOPE_SOURCE=/shop",
		"OUTBOXRELAY_SINK_KAFKA_VALUE_FORMAT=" + format, "OUTBOXRELAY_SINK_KAFKA_SCHEMAS_DIR=" + dir,
		"OUTBOXRELAY_SINK_KAFKA_SCHEMA_REGISTRY_URL=" + registry, "OUTBOXRELAY_RELAY_MAX_ATTEMPTS=1",
	}
}

// TestConfluentWireFormat: each value is the payload after the wire header
// (magic byte 0, the registered id big-endian), JSON or Avro binary, with the
// CloudEvents attributes in ce_ headers; the schema is registered once under
// <topic>-value; a payload that does not match the Avro schema is
// dead-lettered with the reason, and the other aggregates' later messages
// arrive; Confluent's deserializer decodes every record.
func TestConfluentWireFormat(t *testing.T) {
	mods := confluentNodeModules(t)
	for _, format := range []string{"confluent-json-schema", "confluent-avro"} {
		t.Run(format, func(t *testing.T) {
			reg := srtest.New(t)
			dir := confluentSchemas(t)
			e := newEnv(t)
			c := e.consume("outbox.order")
			p := e.start(confluentEnv(format, dir, reg.URL)...)
			p.waitLog(`"streaming"`, 30*time.Second)

			var ids []string
			insert := func(agg, payload string) string {
				var id string
				if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('order', $1, 'order.created', $2) RETURNING id::text`, agg, payload).Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			}
			want := map[string]float64{}
			for i := 1; i <= 3; i++ {
				for _, agg := range []string{"1", "2"} {
					n := i*10 + len(ids)
					id := insert(agg, fmt.Sprintf(`{"order_id": %d, "note": "n%d"}`, n, n))
					ids, want[id] = append(ids, id), float64(n)
				}
			}
			bad := ""
			if format == "confluent-avro" {
				bad = insert("3", `{"order_id": "not a number"}`)
			}
			// The bad row's aggregate is parked behind it (relay.dead_letter_order
			// park); the others go on.
			for _, agg := range []string{"1", "4"} {
				n := 100 + len(ids)
				id := insert(agg, fmt.Sprintf(`{"order_id": %d, "note": null}`, n))
				ids, want[id] = append(ids, id), float64(n)
			}
			recs := c.waitIDs(ids, 60*time.Second)

			subjects := reg.Subjects()
			if len(subjects) != 1 || len(subjects["outbox.order-value"]) != 1 {
				t.Fatalf("registry subjects %v, want one schema under outbox.order-value", subjects)
			}
			id := subjects["outbox.order-value"][0]
			if n := reg.Requests("POST", "/subjects/outbox.order-value/versions"); n != 1 {
				t.Errorf("%d registrations for %d records, want 1", n, len(recs))
			}
			sch := avro.MustParse(confluentAvroSchema)
			for _, r := range recs {
				mid := r.Headers["message_id"]
				if mid == bad {
					t.Errorf("the mismatching payload %s was published", bad)
				}
				if len(r.Value) < 5 || r.Value[0] != 0 || int(binary.BigEndian.Uint32(r.Value[1:5])) != id {
					t.Fatalf("record %s value %q, want the wire header with id %d", mid, r.Value, id)
				}
				var got map[string]any
				if format == "confluent-avro" {
					err := avro.Unmarshal(sch, r.Value[5:], &got)
					if err == nil {
						got["order_id"] = float64(got["order_id"].(int64))
					}
				} else {
					err := json.Unmarshal(r.Value[5:], &got)
					if err != nil {
						t.Fatalf("record %s: %v", mid, err)
					}
				}
				if got["order_id"] != want[mid] {
					t.Errorf("record %s decoded %v, want order_id %v", mid, got, want[mid])
				}
				if r.Headers["ce_id"] != mid || r.Headers["ce_type"] != "order.created" || r.Headers["ce_schemaversion"] != "1" ||
					r.Headers["ce_source"] != "/shop" || !strings.HasPrefix(r.Headers["content-type"], "application/vnd.confluent.") {
					t.Errorf("record %s headers %v", mid, r.Headers)
				}
			}
			if d := duplicates(recs); d > 0 {
				t.Errorf("%d duplicates", d)
			}

			if bad != "" {
				letter := deadLetterError(t, e, bad)
				if want := `payload does not match Avro schema order.created/v1.avsc: at "/order_id": got string, want Avro long`; !strings.Contains(letter, want) {
					t.Errorf("dead letter of %s: %q, want it to contain %q", bad, letter, want)
				}
			}

			flag := map[string]string{"confluent-json-schema": "--confluent-json", "confluent-avro": "--confluent-avro"}[format]
			jsRecs, code := e.kafkajsRead(mods, "outbox.order", len(recs), flag, reg.URL)
			if code != 0 || len(jsRecs) != len(recs) {
				t.Fatalf("kafka-read.js exited %d with %d records: %v", code, len(jsRecs), jsRecs)
			}
			for _, r := range jsRecs {
				mid := one(t, r, "message_id")
				if r.DecodeError != "" {
					t.Errorf("Confluent's deserializer: record %s: %s", mid, r.DecodeError)
					continue
				}
				if r.Decoded["order_id"] != want[mid] {
					t.Errorf("Confluent's deserializer decoded %s as %v, want order_id %v", mid, r.Decoded, want[mid])
				}
			}
			t.Logf("%s: %d records under schema id %d, decoded by @confluentinc/schemaregistry", format, len(jsRecs), id)
			p.stop()
		})
	}
}

// TestConfluentRegistryDownAtStart: a registry that does not answer stops
// the relay at start with one error naming it.
func TestConfluentRegistryDownAtStart(t *testing.T) {
	reg := srtest.New(t)
	url := reg.URL
	reg.Close()
	e := newEnv(t)
	out, code := e.cliEnv(confluentEnv("confluent-avro", confluentSchemas(t), url), "run", "--config", e.config())
	if code == 0 || !strings.Contains(out, "cannot reach the schema registry at "+url) ||
		!strings.Contains(out, "check sink.kafka.schema_registry.url") {
		t.Fatalf("exit %d: %s\nwant one error naming the registry", code, tail(out, 20))
	}
}

// deadLetterError waits for the dead letter of id and returns its error.
func deadLetterError(t *testing.T, e *env, id string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code := e.cli("dlq", "list", "--database-url", e.dbURL, "--json")
		if code != 0 {
			t.Fatalf("dlq list exit %d: %s", code, out)
		}
		var letters []map[string]any
		if err := json.Unmarshal([]byte(out), &letters); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		for _, l := range letters {
			if fmt.Sprint(l["message_id"]) == id {
				return fmt.Sprint(l["error"])
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter for %s within 30 s: %s", id, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// confluentNodeModules is interopNodeModules with Confluent's registry
// client too.
func confluentNodeModules(t *testing.T) string {
	t.Helper()
	mods := interopNodeModules(t)
	if _, err := os.Stat(filepath.Join(mods, "@confluentinc", "schemaregistry", "package.json")); err != nil {
		missingClient(t, "npm package @confluentinc/schemaregistry", "run .ci/interop-deps")
	}
	return mods
}
