package kafka

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/relay"
	"github.com/outboxrelay/outboxrelay/sinks"
	"github.com/outboxrelay/outboxrelay/sinks/kafka/srtest"
)

const (
	orderJSONSchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "OrderCreated",
		"type": "object", "required": ["order_id"],
		"properties": {"order_id": {"type": "integer"}, "total": {"type": "string"}}}`
	orderAvro = `{"type": "record", "name": "OrderCreated", "namespace": "shop.orders", "fields": [
		{"name": "order_id", "type": "long"},
		{"name": "total", "type": "string"},
		{"name": "note", "type": ["null", "string"], "default": null},
		{"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}, "default": "NEW"}]}`
)

// schemaDir writes files (relative name -> text) into a new folder.
func schemaDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// ceMessage is a message as the relay builds it in envelope.format
// cloudevents-binary: the body is the payload, the attributes carry the rest.
func ceMessage(id, aggregateID, eventType string, version int, payload string) *relay.Message {
	em := envelope.Message{MessageID: id, EventType: eventType, SchemaVersion: version, AggregateType: "order",
		AggregateID: aggregateID, OccurredAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Payload: []byte(payload)}
	return &relay.Message{ID: id, AggregateType: "order", AggregateID: aggregateID, EventType: eventType,
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Headers:     []envelope.Header{{Key: "tenant", Value: "acme"}},
		Envelope:    []byte(payload), Attributes: em.CloudEventAttributes("/shop"), Format: relay.FormatCloudEventsBinary}
}

// wire splits a Confluent wire-format value.
func wire(t *testing.T, v []byte) (int, []byte) {
	t.Helper()
	if len(v) < 5 || v[0] != 0 {
		t.Fatalf("value %q does not start with the magic byte 0 and a schema id", v)
	}
	return int(binary.BigEndian.Uint32(v[1:5])), v[5:]
}

func confluentConfig(reg *srtest.Registry, format, dir string) Config {
	return Config{ValueFormat: format, SchemasDir: dir, SchemaRegistry: SchemaRegistry{URL: reg.URL}}
}

func TestConfluentJSONSchema(t *testing.T) {
	reg := srtest.New(t)
	dir := schemaDir(t, map[string]string{"order.created/v1.json": orderJSONSchema})
	c := newCluster(t)
	s := newSink(t, c, confluentConfig(reg, ValueConfluentJSONSchema, dir))
	cons := newConsumer(t, c, "outbox.order")

	payloads := []string{`{"order_id": 1, "total": "9.90"}`, `{"order_id": 2}`, `{"order_id": 3}`}
	var ms []*relay.Message
	for i, p := range payloads {
		m := ceMessage("id-"+string(rune('a'+i)), "42", "order.created", 1, p)
		if err := publishOne(t, s, m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		ms = append(ms, m)
	}
	ids := reg.Subjects()["outbox.order-value"]
	if len(ids) != 1 {
		t.Fatalf("subjects %v, want one schema under outbox.order-value", reg.Subjects())
	}
	if got := reg.Schema(ids[0]); got != orderJSONSchema {
		t.Errorf("registered %q, want the file's text", got)
	}
	if n := reg.Requests("POST", "/subjects/outbox.order-value/versions"); n != 1 {
		t.Errorf("%d registrations for 3 records, want 1 (ids are cached)", n)
	}
	for i, r := range cons.records(t, 3) {
		id, payload := wire(t, r.Value)
		if id != ids[0] || string(payload) != payloads[i] {
			t.Errorf("record %d: id %d payload %q, want %d and %q", i, id, payload, ids[0], payloads[i])
		}
		want := []string{
			"message_id=" + ms[i].ID, "event_type=order.created", "traceparent=" + ms[i].Traceparent,
			"content-type=" + ContentTypeConfluentJSONSchema,
			"ce_specversion=1.0", "ce_id=" + ms[i].ID, "ce_source=/shop", "ce_type=order.created", "ce_subject=42",
			"ce_time=2026-12-01T10:00:00.000000Z", "ce_partitionkey=42",
			"ce_schemaversion=1", "tenant=acme",
		}
		if got := headerList(r); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("record %d headers\n got %q\nwant %q", i, got, want)
		}
	}
}

func TestConfluentAvro(t *testing.T) {
	reg := srtest.New(t)
	dir := schemaDir(t, map[string]string{
		"order.created/v1.json": orderJSONSchema, // ignored: the Avro form is beside it
		"order.created/v1.avsc": orderAvro,
	})
	c := newCluster(t)
	cfg := confluentConfig(reg, ValueConfluentAvro, dir)
	cfg.SchemaRegistry.SubjectStrategy = SubjectRecord
	s := newSink(t, c, cfg)
	cons := newConsumer(t, c, "outbox.order")

	good := ceMessage("m1", "42", "order.created", 1, `{"order_id": 1, "total": "9.90", "note": "gift", "status": "PAID"}`)
	bad := ceMessage("m2", "42", "order.created", 1, `{"order_id": "one", "total": "1"}`)
	later := ceMessage("m3", "42", "order.created", 1, `{"order_id": 3, "total": "3.00"}`)
	if err := publishOne(t, s, good); err != nil {
		t.Fatal(err)
	}
	err := publishOne(t, s, bad)
	if !isPermanent(err) || !strings.Contains(err.Error(), `payload does not match Avro schema order.created/v1.avsc: at "/order_id": got string, want Avro long`) {
		t.Errorf("mismatching payload: %v, want a permanent error naming the file, the field and the types", err)
	}
	if err := publishOne(t, s, later); err != nil {
		t.Fatalf("a later message after a mismatch: %v", err)
	}
	ids := reg.Subjects()["shop.orders.OrderCreated"]
	if len(ids) != 1 {
		t.Fatalf("subjects %v, want the record's full name", reg.Subjects())
	}
	sch := avro.MustParse(orderAvro)
	want := []map[string]any{
		{"order_id": int64(1), "total": "9.90", "note": "gift", "status": "PAID"},
		{"order_id": int64(3), "total": "3.00", "note": nil, "status": "NEW"},
	}
	for i, r := range cons.records(t, 2) {
		id, payload := wire(t, r.Value)
		var got map[string]any
		if err := avro.Unmarshal(sch, payload, &got); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if id != ids[0] || !reflect.DeepEqual(got, want[i]) {
			t.Errorf("record %d: id %d %v, want %d %v", i, id, got, ids[0], want[i])
		}
		if ct := header(r, "content-type"); ct != ContentTypeConfluentAvro {
			t.Errorf("content-type %q", ct)
		}
	}
}

func TestConfluentRegistryDown(t *testing.T) {
	reg := srtest.New(t)
	dir := schemaDir(t, map[string]string{"order.created/v1.json": orderJSONSchema})
	c := newCluster(t)
	cfg := confluentConfig(reg, ValueConfluentJSONSchema, dir)
	cfg.Brokers = c.ListenAddrs()
	cfg.SchemaRegistry.URL = "http://u:s3cret@" + strings.TrimPrefix(reg.URL, "http://")
	reg.Close()

	_, err := cfg.Open(t.Context(), nil)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the schema registry at http://u:xxxxx@") ||
		!strings.Contains(err.Error(), "check sink.kafka.schema_registry.url") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Open with the registry down: %v, want one error naming the registry, password hidden", err)
	}
	if strings.Contains(err.Error(), "cannot reach Kafka") {
		t.Errorf("Open blames Kafka: %v", err)
	}
}

func TestConfluentRegistryFailures(t *testing.T) {
	dir := schemaDir(t, map[string]string{
		"order.created/v1.json": orderJSONSchema,
		"order.paid/v1.json":    `{"type": "object"}`,
	})
	c := newCluster(t)

	t.Run("outage after start is retryable and not asked per record", func(t *testing.T) {
		reg := srtest.New(t)
		s := newSink(t, c, confluentConfig(reg, ValueConfluentJSONSchema, dir))
		reg.Close()
		for i := range 3 {
			err := publishOne(t, s, ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`))
			if err == nil || isPermanent(err) || !relay.Retryable(err) || !strings.Contains(err.Error(), "did not answer") {
				t.Fatalf("publish %d with the registry down: %v, want a retryable error", i, err)
			}
		}
	})
	t.Run("incompatible schema is permanent", func(t *testing.T) {
		reg := srtest.New(t)
		reg.Reject("outbox.order-value")
		s := newSink(t, c, confluentConfig(reg, ValueConfluentJSONSchema, dir))
		err := publishOne(t, s, ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`))
		if !isPermanent(err) || !strings.Contains(err.Error(), "HTTP 409") || !strings.Contains(err.Error(), "order.created/v1.json") {
			t.Fatalf("rejected schema: %v, want a permanent error naming the file and the answer", err)
		}
		for range 3 {
			_ = publishOne(t, s, ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`))
		}
		if n := reg.Requests("POST", "/subjects/outbox.order-value/versions"); n != 1 {
			t.Errorf("%d registrations for 4 records, want 1", n)
		}
	})
	t.Run("read-only registry looks the schema up", func(t *testing.T) {
		reg := srtest.New(t)
		id := reg.Register("outbox.order-value", "JSON", orderJSONSchema)
		reg.ReadOnly(true)
		s := newSink(t, c, confluentConfig(reg, ValueConfluentJSONSchema, dir))
		cons := newConsumer(t, c, "outbox.order")
		if err := publishOne(t, s, ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`)); err != nil {
			t.Fatal(err)
		}
		if got, _ := wire(t, cons.records(t, 1)[0].Value); got != id {
			t.Errorf("id %d, want %d registered by CI", got, id)
		}
		err := publishOne(t, s, ceMessage("m", "1", "order.paid", 1, `{}`))
		if !isPermanent(err) || !strings.Contains(err.Error(), "40403") || !strings.Contains(err.Error(), "register it") {
			t.Errorf("unregistered schema on a read-only registry: %v", err)
		}
	})
	t.Run("message problems", func(t *testing.T) {
		reg := srtest.New(t)
		s := newSink(t, c, confluentConfig(reg, ValueConfluentJSONSchema, dir))
		err := publishOne(t, s, ceMessage("m", "1", "order.created", 2, `{"order_id": 1}`))
		if !isPermanent(err) || !strings.Contains(err.Error(), "add order.created/v2.json to "+dir) {
			t.Errorf("no schema: %v", err)
		}
		m := ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`)
		m.Format = relay.FormatEnvelope
		err = publishOne(t, s, m)
		if err == nil || isPermanent(err) || !strings.Contains(err.Error(), "needs envelope.format: cloudevents-binary") {
			t.Errorf("envelope format: %v, want a retryable error naming the setting", err)
		}
		m = ceMessage("m", "1", "order.created", 1, `hello`)
		m.ContentType = envelope.ContentTypeText
		if err := publishOne(t, s, m); !isPermanent(err) || !strings.Contains(err.Error(), "is not JSON") {
			t.Errorf("text payload: %v", err)
		}
	})
}

func TestConfluentBasicAuth(t *testing.T) {
	dir := schemaDir(t, map[string]string{"order.created/v1.json": orderJSONSchema})
	c := newCluster(t)
	reg := srtest.New(t)
	reg.RequireBasicAuth("key", "secret")

	cfg := confluentConfig(reg, ValueConfluentJSONSchema, dir)
	cfg.SchemaRegistry.Username, cfg.SchemaRegistry.Password = "key", "secret"
	s := newSink(t, c, cfg)
	if err := publishOne(t, s, ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`)); err != nil {
		t.Fatal(err)
	}

	cfg.SchemaRegistry.Username, cfg.SchemaRegistry.Password = "", ""
	cfg.SchemaRegistry.URL = "http://key:secret@" + strings.TrimPrefix(reg.URL, "http://")
	newSink(t, c, cfg) // pings

	cfg.SchemaRegistry.URL = reg.URL
	cfg.SchemaRegistry.Username, cfg.SchemaRegistry.Password = "key", "wrong"
	cfg.Brokers = c.ListenAddrs()
	_, err := cfg.Open(t.Context(), nil)
	if err == nil || !strings.Contains(err.Error(), "refused the relay (HTTP 401") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("wrong password: %v", err)
	}
}

func TestConfluentTLS(t *testing.T) {
	dir := schemaDir(t, map[string]string{"order.created/v1.json": orderJSONSchema})
	c := newCluster(t)
	reg := srtest.NewTLS(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: reg.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := confluentConfig(reg, ValueConfluentJSONSchema, dir)
	cfg.Brokers = c.ListenAddrs()
	_, err := cfg.Open(t.Context(), nil)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the schema registry at "+reg.URL) || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Open without the registry's CA: %v", err)
	}
	cfg.SchemaRegistry.TLSFiles = sinks.TLS{Enabled: true, CAFile: ca}
	s := newSink(t, c, cfg)
	if err := publishOne(t, s, ceMessage("m", "1", "order.created", 1, `{"order_id": 1}`)); err != nil {
		t.Fatal(err)
	}
	if len(reg.Subjects()["outbox.order-value"]) != 1 {
		t.Errorf("subjects %v", reg.Subjects())
	}
}

func TestConfluentExactlyOnce(t *testing.T) {
	reg := srtest.New(t)
	dir := schemaDir(t, map[string]string{"order.created/v1.avsc": orderAvro})
	c := newCluster(t)
	cfg := confluentConfig(reg, ValueConfluentAvro, dir)
	cfg.Brokers, cfg.ExactlyOnce, cfg.TransactionalID = c.ListenAddrs(), true, "t1"
	set, err := cfg.Open(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	s := set.(*TxnSink)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	if _, err := s.Position(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	s.Publish(ctx, ceMessage("m1", "1", "order.created", 1, `{"order_id": 7, "total": "1"}`), func(_ *relay.Message, err error) { got <- err })
	s.EndTxn(100)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("outbox.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	defer fcancel()
	var recs []*kgo.Record
	for len(recs) == 0 && fctx.Err() == nil {
		recs = cl.PollFetches(fctx).Records()
	}
	if len(recs) != 1 {
		t.Fatalf("%d committed records", len(recs))
	}
	_, payload := wire(t, recs[0].Value)
	var v map[string]any
	if err := avro.Unmarshal(avro.MustParse(orderAvro), payload, &v); err != nil || v["order_id"] != int64(7) {
		t.Errorf("decoded %v, %v", v, err)
	}
	cancel()
	<-runDone
}

func TestConfluentConfig(t *testing.T) {
	dir := schemaDir(t, map[string]string{"order.created/v1.json": orderJSONSchema})
	base := Config{Brokers: []string{"localhost:9092"}, ValueFormat: ValueConfluentAvro, SchemasDir: dir,
		SchemaRegistry: SchemaRegistry{URL: "http://localhost:8081"}}
	if err := base.Validate(); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.ValueFormat = "protobuf" }, `sink.kafka.value_format "protobuf" is not one of`},
		{func(c *Config) { c.SchemaRegistry.URL = "" }, "sink.kafka.schema_registry.url is empty"},
		{func(c *Config) { c.SchemaRegistry.URL = "ftp://u:pw@host" }, `sink.kafka.schema_registry.url "ftp://u:xxxxx@host" is not an http://`},
		{func(c *Config) { c.SchemasDir = "" }, "sink.kafka.schemas_dir is empty"},
		{func(c *Config) { c.SchemaRegistry.SubjectStrategy = "topicrecord" }, "subject_strategy \"topicrecord\" is not one of topic, record"},
		{func(c *Config) { c.SchemaRegistry.Username = "u" }, "username and password go together"},
		{func(c *Config) { c.SchemaRegistry.TLSFiles.Enabled = true }, "tls.enabled needs an https://"},
		{func(c *Config) {
			c.SchemaRegistry.URL = "https://a:b@host"
			c.SchemaRegistry.Username, c.SchemaRegistry.Password = "u", "p"
		}, "carries a user and sink.kafka.schema_registry.username is set"},
	} {
		c := base
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want %q", err, tc.want)
		}
	}

	c := base
	c.SchemaRegistry.Username, c.SchemaRegistry.Password = "u", "p"
	c.SchemaRegistry.TLSFiles.InsecureSkipVerify, c.SchemaRegistry.TLSFiles.Enabled = true, true
	if ws := strings.Join(c.Warnings(), "\n"); !strings.Contains(ws, "schema_registry.url is http:// and sends the registry password unencrypted") ||
		!strings.Contains(ws, "schema_registry.tls.insecure_skip_verify accepts any registry certificate") {
		t.Errorf("Warnings = %q", ws)
	}
	if ws := base.Warnings(); len(ws) != 0 {
		t.Errorf("Warnings without a password = %q", ws)
	}

	// Files that cannot be registered stop the sink at New.
	for files, want := range map[string]string{
		`{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nosuch"}]}`: "avro schema order.created/v1.avsc:",
	} {
		c := base
		c.SchemasDir = schemaDir(t, map[string]string{"order.created/v1.avsc": files})
		if _, err := New(c, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v, want %q", err, want)
		}
	}
	c = base
	c.ValueFormat = ValueConfluentJSONSchema
	c.SchemasDir = schemaDir(t, map[string]string{"order.created/v1.json": `{"$ref": "../_shared/money.json"}`})
	if _, err := New(c, nil); err == nil || !strings.Contains(err.Error(), `schema order.created/v1.json: $ref "../_shared/money.json" names another file`) {
		t.Errorf("New with an external $ref = %v", err)
	}
	c.SchemasDir = schemaDir(t, map[string]string{"order.created/one.avsc": orderAvro})
	c.ValueFormat = ValueConfluentAvro
	if _, err := New(c, nil); err == nil || !strings.Contains(err.Error(), "order.created/one.avsc is not named v<version>.avsc") {
		t.Errorf("New with a misnamed file = %v", err)
	}
}

func TestEncodeAvro(t *testing.T) {
	sch := avro.MustParse(`{"type": "record", "name": "R", "fields": [
		{"name": "i", "type": "int"},
		{"name": "d", "type": "double", "default": 0.5},
		{"name": "b", "type": "boolean", "default": false},
		{"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
		{"name": "day", "type": {"type": "int", "logicalType": "date"}, "default": 0},
		{"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}, "default": "\u0000"},
		{"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
		{"name": "attrs", "type": {"type": "map", "values": "long"}, "default": {}},
		{"name": "raw", "type": {"type": "fixed", "name": "Two", "size": 2}, "default": "ab"},
		{"name": "u", "type": ["null", "long", {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "string"}]}], "default": null}]}`)
	for _, tc := range []struct {
		payload string
		want    string // JSON of the decoded value, or the error
	}{
		{`{"i": 1}`, `{"amount":"0","attrs":{},"b":false,"d":0.5,"day":"1970-01-01T00:00:00Z","i":1,"raw":[97,98],"tags":[],"ts":"1970-01-01T00:00:00Z","u":null}`},
		{`{"i": -2, "d": 3, "b": true, "ts": "2026-12-01T10:00:00.123Z", "day": "2026-12-01", "amount": 12.34, "tags": ["a"], "attrs": {"k": 5}, "raw": "xy", "u": 9}`,
			`{"amount":"617/50","attrs":{"k":5},"b":true,"d":3,"day":"2026-12-01T00:00:00Z","i":-2,"raw":[120,121],"tags":["a"],"ts":"2026-12-01T10:00:00.123Z","u":{"long":9}}`},
		{`{"i": 1, "u": {"x": "in"}}`, `"u":{"Inner":{"x":"in"}}`},
		{`{"i": 1.5}`, `at "/i": got number 1.5, want Avro int (an integer in range)`},
		{`{"i": 3000000000}`, `at "/i": got number 3000000000, want Avro int (an integer in range)`},
		{`{}`, `at "": required field "i" is missing and has no default`},
		{`{"i": 1, "extra": true}`, `field "extra" is not in Avro record R`},
		{`{"i": 1, "u": "str"}`, `at "/u": got string, want Avro union`},
		{`{"i": 1, "raw": "abc"}`, `at "/raw": got string, want Avro Two of 2 bytes, got 3`},
		{`{"i": "1"}`, `at "/i": got string, want Avro int` + "\x00"},
		{`{"i": 1, "ts": "yesterday"}`, `at "/ts": got string, want Avro long.timestamp-millis: parsing time`},
		{`{"i": 1, "tags": [1]}`, `at "/tags/0": got number 1, want Avro string`},
		{`[1]`, `at "": got array, want Avro R`},
		{`{"i": 1} x`, `payload is not JSON`},
	} {
		b, err := encodeAvro(sch, []byte(tc.payload))
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			var v map[string]any
			if err := avro.Unmarshal(sch, b, &v); err != nil {
				t.Fatalf("%s: decode: %v", tc.payload, err)
			}
			j, _ := json.Marshal(v)
			got = string(j)
		}
		if want, exact := strings.CutSuffix(tc.want, "\x00"); exact && got != want || !exact && !strings.Contains(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", tc.payload, got, tc.want)
		}
	}
}
