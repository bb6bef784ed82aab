package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// recorder is an Execer that records statements instead of running them.
// The DB-backed counterparts of these tests are in
// integration/producer_test.go; envelope/outbox_test.go and
// schema/outbox_test.go, in the relay's module, check that the relay reads
// what this package writes (this module does not depend on the relay's).
type recorder struct {
	mu    sync.Mutex
	calls []call
	err   error
}

type call struct {
	query string
	args  []any
}

func (r *recorder) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{query, args})
	return driver.RowsAffected(1), r.err
}

// localSpan returns a context carrying a span of this process, as a
// tracer's Start would, sampled or not.
func localSpan(sampled bool) (context.Context, trace.SpanContext) {
	var flags trace.TraceFlags
	if sampled {
		flags = trace.FlagsSampled
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: flags,
	})
	return trace.ContextWithSpanContext(context.Background(), sc), sc
}

func valid() outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: json.RawMessage(`{"total":"99.90"}`)}
}

func TestValidationSendsNothing(t *testing.T) {
	type cyclic struct{ Self *cyclic }
	loop := &cyclic{}
	loop.Self = loop
	var nilMap *map[string]int
	for _, tc := range []struct {
		name string
		edit func(*outbox.Event)
		want string
	}{
		{"no aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "aggregate type is empty"},
		{"no aggregate id", func(e *outbox.Event) { e.AggregateID = "" }, "aggregate id is empty"},
		{"no event type", func(e *outbox.Event) { e.EventType = "" }, "event type is empty"},
		{"NUL in aggregate id", func(e *outbox.Event) { e.AggregateID = "4\x002" }, "aggregate id"},
		{"bad UTF-8 event type", func(e *outbox.Event) { e.EventType = "order.\xff" }, "event type"},
		{"nil payload", func(e *outbox.Event) { e.Payload = nil }, "payload is nil"},
		{"nil pointer payload", func(e *outbox.Event) { e.Payload = nilMap }, "payload is a nil pointer"},
		{"raw payload not JSON", func(e *outbox.Event) { e.Payload = json.RawMessage(`{"total":`) }, "payload is not valid JSON"},
		{"bytes payload not JSON", func(e *outbox.Event) { e.Payload = []byte("total=1") }, "payload is not valid JSON"},
		{"string payload not JSON", func(e *outbox.Event) { e.Payload = "order 42 created" }, "payload is not valid JSON"},
		{"empty payload", func(e *outbox.Event) { e.Payload = []byte(" ") }, "payload is empty"},
		{"two JSON values", func(e *outbox.Event) { e.Payload = json.RawMessage(`{} {}`) }, "payload is not valid JSON"},
		{"payload not UTF-8", func(e *outbox.Event) { e.Payload = []byte("\"\xff\"") }, "payload is not valid UTF-8"},
		{"payload with NUL escape", func(e *outbox.Event) { e.Payload = json.RawMessage(`{"a":"x\u0000"}`) }, `payload contains \u0000`},
		{"marshaled payload with NUL", func(e *outbox.Event) { e.Payload = map[string]string{"a": "\x00"} }, `payload contains \u0000`},
		{"unencodable payload", func(e *outbox.Event) { e.Payload = make(chan int) }, "payload cannot be encoded as JSON"},
		{"cyclic payload", func(e *outbox.Event) { e.Payload = loop }, "payload cannot be encoded as JSON"},
		{"negative schema version", func(e *outbox.Event) { e.SchemaVersion = -1 }, "schema version -1"},
		{"huge schema version", func(e *outbox.Event) { e.SchemaVersion = 1 << 31 }, "schema version 2147483648"},
		{"NUL in header", func(e *outbox.Event) { e.Headers = map[string]string{"tenant": "a\x00"} }, `header "tenant"`},
		{"reserved header", func(e *outbox.Event) { e.Headers = map[string]string{"tenant": "acme", "message_id": "SPOOFED"} }, `header "message_id" is a name the relay sets itself`},
		{"reserved header any case", func(e *outbox.Event) { e.Headers = map[string]string{"Content-Type": "text/evil"} }, `header "Content-Type"`},
		{"reserved prefix", func(e *outbox.Event) { e.Headers = map[string]string{"ce_id": "x", "CE-type": "y"} }, `header "CE-type"`},
		{"debezium id header", func(e *outbox.Event) { e.Headers = map[string]string{"id": "x"} }, `header "id"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := valid()
			tc.edit(&e)
			check := func(op string, id uuid.UUID, err error) {
				t.Helper()
				if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s error = %v, want ErrInvalidEvent containing %q", op, err, tc.want)
				}
				if id != uuid.Nil {
					t.Errorf("%s returned id %s with an error", op, id)
				}
			}
			var r recorder
			id, err := outbox.Write(t.Context(), &r, e)
			check("Write", id, err)
			id, err = outbox.Emit(t.Context(), &r, e)
			check("Emit", id, err)
			ids, err := outbox.WriteBatch(t.Context(), &r, []outbox.Event{valid(), valid(), e})
			check("WriteBatch", uuid.Nil, err)
			if ids != nil || !strings.Contains(err.Error(), "event 2:") {
				t.Errorf("WriteBatch = %v, %v; want no ids and an error naming event 2", ids, err)
			}
			if len(r.calls) != 0 {
				t.Errorf("invalid event sent %d statements: %q", len(r.calls), r.calls[0].query)
			}
		})
	}
}

func TestPayloadForms(t *testing.T) {
	type order struct {
		ID    int    `json:"id"`
		Total string `json:"total"`
		Note  string `json:"note"`
	}
	for _, tc := range []struct {
		payload any
		want    string
	}{
		{json.RawMessage(` {"a": 1} `), `{"a": 1}`},
		{[]byte(`[1,2]`), `[1,2]`},
		{`"just a string"`, `"just a string"`},
		{json.RawMessage(`null`), `null`},
		{order{ID: 42, Total: "99.90", Note: "<b>&</b>"}, `{"id":42,"total":"99.90","note":"<b>&</b>"}`},
		{&order{ID: 1}, `{"id":1,"total":"","note":""}`},
		{map[string]any{"b": 2, "a": 1}, `{"a":1,"b":2}`},
		{42, `42`},
		{json.RawMessage(`{"path":"C:\\u0000"}`), `{"path":"C:\\u0000"}`}, // an escaped backslash, not NUL
	} {
		var r recorder
		if _, err := outbox.Write(t.Context(), &r, outbox.Event{AggregateType: "a", AggregateID: "b", EventType: "c", Payload: tc.payload}); err != nil {
			t.Errorf("payload %#v: %v", tc.payload, err)
			continue
		}
		if got := r.calls[0].args[4]; got != tc.want {
			t.Errorf("payload %#v stored as %q, want %q", tc.payload, got, tc.want)
		}
	}
}

func TestWriteStatement(t *testing.T) {
	var r recorder
	e := valid()
	e.Headers = map[string]string{"tenant": "acme", "b": "2"}
	e.SchemaVersion = 3
	id, err := outbox.Write(context.Background(), &r, e)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.calls) != 1 {
		t.Fatalf("%d statements, want 1", len(r.calls))
	}
	c := r.calls[0]
	wantSQL := `INSERT INTO "public"."outbox" ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "traceparent", "schema_version") VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
	if c.query != wantSQL {
		t.Errorf("query\n got %s\nwant %s", c.query, wantSQL)
	}
	want := []any{id.String(), "order", "42", "order.created", `{"total":"99.90"}`, `{"b":"2","tenant":"acme"}`, nil, 3}
	if !reflect.DeepEqual(c.args, want) {
		t.Errorf("args\n got %#v\nwant %#v", c.args, want)
	}
	if id.Version() != 7 {
		t.Errorf("id %s is version %d, want 7", id, id.Version())
	}
}

func TestOptions(t *testing.T) {
	ctx, sc := localSpan(true)

	w, err := outbox.New(outbox.Debezium(), outbox.DeleteAfterInsert())
	if err != nil {
		t.Fatal(err)
	}
	var r recorder
	ids, err := w.WriteBatch(ctx, &r, []outbox.Event{valid(), valid()})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.calls) != 2 {
		t.Fatalf("%d statements, want insert and delete", len(r.calls))
	}
	wantInsert := `INSERT INTO "public"."outboxevent" ("id", "aggregatetype", "aggregateid", "type", "payload", "tracingspancontext") VALUES ($1, $2, $3, $4, $5, $6), ($7, $8, $9, $10, $11, $12)`
	if r.calls[0].query != wantInsert {
		t.Errorf("insert\n got %s\nwant %s", r.calls[0].query, wantInsert)
	}
	wantTP := "traceparent=00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	if got := r.calls[0].args[5]; got != wantTP {
		t.Errorf("tracingspancontext = %v, want %s", got, wantTP)
	}
	if got, want := r.calls[1].query, `DELETE FROM "public"."outboxevent" WHERE "id" IN ($1, $2)`; got != want {
		t.Errorf("delete\n got %s\nwant %s", got, want)
	}
	if !reflect.DeepEqual(r.calls[1].args, []any{ids[0].String(), ids[1].String()}) {
		t.Errorf("delete args %v, want %v", r.calls[1].args, ids)
	}

	w, err = outbox.New(outbox.TableName(`shop.Outbox"x`), outbox.Debezium(),
		outbox.ColumnNames(outbox.Columns{ID: "uid", AggregateType: "at", AggregateID: "ai", EventType: "et", Payload: "body"}))
	if err != nil {
		t.Fatal(err)
	}
	r = recorder{}
	if _, err := w.Write(ctx, &r, valid()); err != nil {
		t.Fatal(err)
	}
	if got, want := r.calls[0].query, `INSERT INTO "shop"."Outbox""x" ("uid", "at", "ai", "et", "body") VALUES ($1, $2, $3, $4, $5)`; got != want {
		t.Errorf("custom table\n got %s\nwant %s", got, want)
	}

	for _, opts := range [][]outbox.Option{
		{outbox.TableName("a.b.c")},
		{outbox.TableName(".outbox")},
		{outbox.ColumnNames(outbox.Columns{ID: "id"})},
	} {
		if _, err := outbox.New(opts...); err == nil {
			t.Errorf("New(%v) succeeded, want an error", opts)
		}
	}
}

func TestTraceparent(t *testing.T) {
	for sampled, flags := range map[bool]string{true: "01", false: "00"} {
		ctx, sc := localSpan(sampled)
		want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + flags

		var r recorder
		if _, err := outbox.Write(ctx, &r, valid()); err != nil {
			t.Fatal(err)
		}
		if got := r.calls[0].args[6]; got != want {
			t.Errorf("traceparent = %v, want %s", got, want)
		}
	}

	// A remote parent (from an incoming request) counts too.
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	var r recorder
	if _, err := outbox.Write(trace.ContextWithRemoteSpanContext(context.Background(), remote), &r, valid()); err != nil {
		t.Fatal(err)
	}
	if got := r.calls[0].args[6]; got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("traceparent from remote span context = %v", got)
	}
	// No span, or an invalid one: NULL, and the relay starts a trace.
	for _, ctx := range []context.Context{context.Background(), trace.ContextWithSpanContext(context.Background(), trace.SpanContext{})} {
		r = recorder{}
		if _, err := outbox.Write(ctx, &r, valid()); err != nil {
			t.Fatal(err)
		}
		if got := r.calls[0].args[6]; got != nil {
			t.Errorf("traceparent without a span = %#v, want nil", got)
		}
	}
}

func TestEmitContent(t *testing.T) {
	ctx, sc := localSpan(true)

	w, err := outbox.New(outbox.MessagePrefix("shop"))
	if err != nil {
		t.Fatal(err)
	}
	var r recorder
	e := valid()
	e.Headers = map[string]string{"tenant": "acme"}
	e.SchemaVersion = 2
	id, err := w.Emit(ctx, &r, e)
	if err != nil {
		t.Fatal(err)
	}
	c := r.calls[0]
	if c.query != "SELECT pg_logical_emit_message(true, $1::text, $2::text)" || c.args[0] != "shop" {
		t.Fatalf("statement %s %v", c.query, c.args)
	}
	// envelope/outbox_test.go parses it as the relay does.
	var got map[string]any
	if err := json.Unmarshal([]byte(c.args[1].(string)), &got); err != nil {
		t.Fatalf("content %s is not JSON: %v", c.args[1], err)
	}
	if got["id"] != id.String() || got["traceparent"] != "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01" {
		t.Errorf("content %s: id or traceparent missing", c.args[1])
	}

	// Optional keys are left out rather than written empty.
	r = recorder{}
	if _, err := outbox.Emit(context.Background(), &r, valid()); err != nil {
		t.Fatal(err)
	}
	content := r.calls[0].args[1].(string)
	if strings.Contains(content, "headers") || strings.Contains(content, "traceparent") || r.calls[0].args[0] != "outboxrelay" {
		t.Errorf("content %s, prefix %v", content, r.calls[0].args[0])
	}
}

func TestIDsIncrease(t *testing.T) {
	var r recorder
	events := make([]outbox.Event, 20000)
	for i := range events {
		events[i] = valid()
	}
	ids, err := outbox.WriteBatch(context.Background(), &r, events)
	if err != nil {
		t.Fatal(err)
	}
	// 8 parameters a row: 8191 rows fit into one statement.
	if len(r.calls) != 3 || len(r.calls[0].args) != 8191*8 || len(r.calls[2].args) != (20000-2*8191)*8 {
		t.Fatalf("%d statements for 20000 events", len(r.calls))
	}
	seen := map[uuid.UUID]bool{}
	var last uuid.UUID
	for i, id := range ids {
		if id.Version() != 7 || id.Variant() != uuid.RFC4122 {
			t.Fatalf("id %s is not a UUIDv7", id)
		}
		if bytes.Compare(id[:], last[:]) <= 0 || id.String() <= last.String() {
			t.Fatalf("id %d %s does not sort after %s", i, id, last)
		}
		if r.calls[i/8191].args[(i%8191)*8] != id.String() {
			t.Fatalf("id %d is not the one written", i)
		}
		seen[id], last = true, id
	}
	// Across calls and goroutines they stay unique, and each caller's
	// sequence increases.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 8 {
		wg.Go(func() {
			var prev uuid.UUID
			for range 1000 {
				id, err := outbox.Emit(context.Background(), &recorder{}, valid())
				if err != nil {
					t.Error(err)
					return
				}
				if bytes.Compare(id[:], prev[:]) <= 0 {
					t.Errorf("id %s after %s", id, prev)
				}
				prev = id
				mu.Lock()
				if seen[id] {
					t.Errorf("duplicate id %s", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

func TestDatabaseErrorIsWrapped(t *testing.T) {
	boom := errors.New("connection reset")
	r := &recorder{err: boom}
	_, err := outbox.Write(context.Background(), r, valid())
	if !errors.Is(err, boom) || errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "insert into public.outbox") {
		t.Errorf("err = %v", err)
	}
	_, err = outbox.Emit(context.Background(), r, valid())
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "emit message") {
		t.Errorf("err = %v", err)
	}
	if ids, err := outbox.WriteBatch(context.Background(), r, nil); ids != nil || err != nil {
		t.Errorf("empty batch = %v, %v", ids, err)
	}
}

// TestDependencies keeps the library light for services: no broker
// clients, logging, metrics, drivers or relay packages.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/twmb/", "github.com/rabbitmq/", "go.uber.org/", "github.com/prometheus/",
			"github.com/jackc/", "github.com/outboxrelay/outboxrelay/", "go.opentelemetry.io/otel/sdk"} {
			if strings.HasPrefix(dep, banned) && dep != "github.com/outboxrelay/outboxrelay/outbox" {
				t.Errorf("package outbox depends on %s", dep)
			}
		}
	}
}
