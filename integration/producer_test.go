package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/outbox/outboxpgx"
	"github.com/outboxrelay/outboxrelay/outbox/schema"
)

// The producer library (package outbox) writes what the relay publishes.

// tracedContext returns a context carrying a real, sampled OpenTelemetry SDK span.
func tracedContext(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("producer_test").Start(t.Context(), "place order")
	t.Cleanup(func() { span.End() })
	return ctx, span.SpanContext()
}

func w3c(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// startProducerEnv starts the relay and a consumer of outbox.order.
func startProducerEnv(t *testing.T, e *env, extraEnv ...string) *consumer {
	t.Helper()
	c := e.consume("outbox.order")
	p := e.start(extraEnv...)
	p.waitLog(`"streaming"`, 30*time.Second)
	return c
}

func strs(ids ...uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

func byID(recs []record) map[string]record {
	m := map[string]record{}
	for _, r := range recs {
		m[r.Headers["message_id"]] = r
	}
	return m
}

// keyOrder lists the message ids of the records with Kafka key key, in
// the order they were consumed, first deliveries only.
func keyOrder(recs []record, key string) []string {
	var ids []string
	seen := map[string]bool{}
	for _, r := range recs {
		id := r.Headers["message_id"]
		if r.Key == key && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

func orderEvent(aggID string, seq int) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: aggID, EventType: "order.updated",
		Payload: map[string]int{"seq": seq}}
}

// checkEnvelope compares the envelope fields and headers that the producer decides.
func checkEnvelope(t *testing.T, r record, id uuid.UUID, ev outbox.Event, sc trace.SpanContext, table string) {
	t.Helper()
	env := r.Env
	sv := max(ev.SchemaVersion, 1)
	want := map[string]any{
		"envelope_version": 1.0, "message_id": id.String(), "event_type": ev.EventType, "schema_version": float64(sv),
		"aggregate_type": ev.AggregateType, "aggregate_id": ev.AggregateID,
		"trace_id": sc.TraceID().String(), "traceparent": w3c(sc),
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("message %s: envelope %s = %v, want %v", id, k, env[k], v)
		}
	}
	if r.Topic != "outbox."+ev.AggregateType || r.Key != ev.AggregateID {
		t.Errorf("message %s: topic %q key %q", id, r.Topic, r.Key)
	}
	if r.Headers["traceparent"] != w3c(sc) || r.Headers["event_type"] != ev.EventType {
		t.Errorf("message %s: headers %v", id, r.Headers)
	}
	for k, v := range ev.Headers {
		if r.Headers[k] != v {
			t.Errorf("message %s: header %s = %q, want %q", id, k, r.Headers[k], v)
		}
	}
	var raw []byte
	switch p := ev.Payload.(type) {
	case json.RawMessage:
		raw = p
	case []byte:
		raw = p
	case string:
		raw = []byte(p)
	default:
		raw, _ = json.Marshal(p)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	wantPayload, _ := json.Marshal(v)
	if got, _ := json.Marshal(env["payload"]); string(got) != string(wantPayload) {
		t.Errorf("message %s: payload %s, want %s", id, got, wantPayload)
	}
	if src, _ := env["source"].(map[string]any); src["table"] != table {
		t.Errorf("message %s: source.table = %v, want %q", id, env["source"], table)
	}
}

// TestProducerWriteAndEmit: a row and a table-less message written by the
// library arrive with the returned message id and the span's trace.
func TestProducerWriteAndEmit(t *testing.T) {
	e := newEnv(t)
	c := startProducerEnv(t, e)
	ctx, sc := tracedContext(t)

	row := outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: map[string]any{"order_id": 42, "total": "99.90"}, Headers: map[string]string{"tenant": "acme"}, SchemaVersion: 2}
	msg := outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.paid",
		Payload: json.RawMessage(`{"order_id": 42, "method": "card"}`), Headers: map[string]string{"tenant": "acme"}, SchemaVersion: 3}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rowID, err := outbox.Write(ctx, outboxpgx.Tx(tx), row)
	if err != nil {
		t.Fatal(err)
	}
	msgID, err := outbox.Emit(ctx, outboxpgx.Tx(tx), msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := e.db.QueryRow(ctx, "SELECT id::text FROM outbox").Scan(&stored); err != nil || stored != rowID.String() {
		t.Errorf("outbox row id %q (%v), want %s", stored, err, rowID)
	}
	got := byID(c.waitIDs(strs(rowID, msgID), 30*time.Second))
	checkEnvelope(t, got[rowID.String()], rowID, row, sc, "public.outbox")
	checkEnvelope(t, got[msgID.String()], msgID, msg, sc, "")
}

// TestProducerRollback: events of a rolled-back transaction, or under a
// rolled-back savepoint, never arrive.
func TestProducerRollback(t *testing.T) {
	e := newEnv(t)
	c := startProducerEnv(t, e)
	ctx := t.Context()

	var lost []uuid.UUID
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		id, err := outbox.Emit(ctx, outboxpgx.Tx(tx), orderEvent("1", i))
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, id)
	}
	id, err := outbox.Write(ctx, outboxpgx.Tx(tx), orderEvent("1", 3))
	if err != nil {
		t.Fatal(err)
	}
	lost = append(lost, id)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	tx, err = e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, err := outbox.Emit(ctx, outboxpgx.Tx(tx), orderEvent("2", 0))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		id, err := outbox.Emit(ctx, outboxpgx.Tx(sp), orderEvent("2", 1+i))
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, id)
	}
	if err := sp.Rollback(ctx); err != nil { // ROLLBACK TO SAVEPOINT
		t.Fatal(err)
	}
	after, err := outbox.Emit(ctx, outboxpgx.Tx(tx), orderEvent("2", 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Once the later commit has arrived, an earlier one would have too.
	recs := c.waitIDs(strs(before, after), 30*time.Second)
	got := byID(recs)
	for _, id := range lost {
		if _, ok := got[id.String()]; ok {
			t.Errorf("rolled-back event %s was published", id)
		}
	}
	if order := keyOrder(recs, "2"); !slices.Equal(order, strs(before, after)) {
		t.Errorf("aggregate 2 got %v, want %v", order, strs(before, after))
	}
}

// TestProducerOrder: Write, WriteBatch and Emit mixed in transactions keep
// the order of the calls, per aggregate, across transactions too.
func TestProducerOrder(t *testing.T) {
	e := newEnv(t)
	c := startProducerEnv(t, e)
	ctx, _ := tracedContext(t)

	var want []uuid.UUID
	seq := 0
	for range 3 {
		tx, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		db := outboxpgx.Tx(tx)
		for i := range 12 {
			var ids []uuid.UUID
			var err error
			switch i % 3 {
			case 0:
				var id uuid.UUID
				id, err = outbox.Write(ctx, db, orderEvent("7", seq))
				ids = []uuid.UUID{id}
			case 1:
				var id uuid.UUID
				id, err = outbox.Emit(ctx, db, orderEvent("7", seq))
				ids = []uuid.UUID{id}
			case 2:
				ids, err = outbox.WriteBatch(ctx, db, []outbox.Event{orderEvent("7", seq), orderEvent("8", seq), orderEvent("7", seq+1)})
				ids = []uuid.UUID{ids[0], ids[2]}
				seq++
			}
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, ids...)
			seq++
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	recs := c.waitIDs(strs(want...), 30*time.Second)
	if got := keyOrder(recs, "7"); !slices.Equal(got, strs(want...)) {
		t.Errorf("aggregate 7 arrived in order\n%v\nwant\n%v", got, strs(want...))
	}
	// The ids were made in call order, so they sort in commit order here.
	if !slices.IsSortedFunc(want, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) }) {
		t.Errorf("ids do not increase: %v", want)
	}
}

// TestProducerBatch: a large batch is one statement per 8191 events and
// arrives complete and in order.
func TestProducerBatch(t *testing.T) {
	e := newEnv(t)
	c := startProducerEnv(t, e)
	ctx, sc := tracedContext(t)

	events := make([]outbox.Event, 9000)
	for i := range events {
		events[i] = orderEvent(fmt.Sprint(i%3), i)
	}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.WriteBatch(ctx, outboxpgx.Tx(tx), events)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recs := c.waitIDs(strs(ids...), 60*time.Second)
	for agg := range 3 {
		var want []string
		for i, id := range ids {
			if i%3 == agg {
				want = append(want, id.String())
			}
		}
		if got := keyOrder(recs, fmt.Sprint(agg)); !slices.Equal(got, want) {
			t.Errorf("aggregate %d: %d events out of order", agg, len(got))
		}
	}
	got := byID(recs)
	checkEnvelope(t, got[ids[4242].String()], ids[4242], events[4242], sc, "public.outbox")
}

// TestProducerDeleteAfterInsert: the table stays empty, the events arrive.
func TestProducerDeleteAfterInsert(t *testing.T) {
	e := newEnv(t)
	c := startProducerEnv(t, e)
	ctx, sc := tracedContext(t)
	w, err := outbox.New(outbox.DeleteAfterInsert())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	one, err := w.Write(ctx, outboxpgx.Tx(tx), orderEvent("5", 0))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := w.WriteBatch(ctx, outboxpgx.Tx(tx), []outbox.Event{orderEvent("5", 1), orderEvent("5", 2)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil || n != 0 {
		t.Errorf("outbox has %d rows (%v), want 0", n, err)
	}
	want := append([]uuid.UUID{one}, batch...)
	recs := c.waitIDs(strs(want...), 30*time.Second)
	if got := keyOrder(recs, "5"); !slices.Equal(got, strs(want...)) {
		t.Errorf("order %v, want %v", got, want)
	}
	checkEnvelope(t, byID(recs)[one.String()], one, orderEvent("5", 0), sc, "public.outbox")
}

// TestProducerDatabaseSQL: the same through database/sql (pgx's stdlib
// driver), where *sql.Tx is used as it is.
func TestProducerDatabaseSQL(t *testing.T) {
	e := newEnv(t)
	c := startProducerEnv(t, e)
	ctx, sc := tracedContext(t)
	db, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := outbox.Write(ctx, tx, orderEvent("9", -1))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{AggregateType: "order", AggregateID: "9", EventType: "order.created",
		Payload: []byte(`{"order_id": 9}`), Headers: map[string]string{"tenant": "acme"}, SchemaVersion: 4}
	row, err := outbox.Write(ctx, tx, ev)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := outbox.Emit(ctx, tx, ev)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := outbox.WriteBatch(ctx, tx, []outbox.Event{orderEvent("9", 1), orderEvent("9", 2)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	want := append([]uuid.UUID{row, msg}, batch...)
	recs := c.waitIDs(strs(want...), 30*time.Second)
	got := byID(recs)
	checkEnvelope(t, got[row.String()], row, ev, sc, "public.outbox")
	checkEnvelope(t, got[msg.String()], msg, ev, sc, "")
	if order := keyOrder(recs, "9"); !slices.Equal(order, strs(want...)) {
		t.Errorf("order %v, want %v", order, want)
	}
	if _, ok := got[lost.String()]; ok {
		t.Errorf("rolled-back event %s was published", lost)
	}
}

// TestProducerDebezium: a Debezium-shaped table (`migrate --debezium`),
// mapped column by column in the relay's configuration.
func TestProducerDebezium(t *testing.T) {
	e := newEnv(t)
	if out, code := e.cli("migrate", "--database-url", e.dbURL, "--debezium"); code != 0 {
		t.Fatalf("migrate --debezium exited %d: %s", code, out)
	}
	c := startProducerEnv(t, e,
		"OUTBOXRELAY_POSTGRES_TABLES=public.outboxevent",
		"OUTBOXRELAY_POSTGRES_COLUMNS_ID=id",
		"OUTBOXRELAY_POSTGRES_COLUMNS_AGGREGATE_TYPE=aggregatetype",
		"OUTBOXRELAY_POSTGRES_COLUMNS_AGGREGATE_ID=aggregateid",
		"OUTBOXRELAY_POSTGRES_COLUMNS_EVENT_TYPE=type",
		"OUTBOXRELAY_POSTGRES_COLUMNS_PAYLOAD=payload",
		"OUTBOXRELAY_POSTGRES_COLUMNS_HEADERS=",
		"OUTBOXRELAY_POSTGRES_COLUMNS_TRACEPARENT=tracingspancontext",
		"OUTBOXRELAY_POSTGRES_COLUMNS_SCHEMA_VERSION=",
		"OUTBOXRELAY_POSTGRES_COLUMNS_CREATED_AT=",
	)
	ctx, sc := tracedContext(t)
	w, err := outbox.New(outbox.Debezium())
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{AggregateType: "order", AggregateID: "11", EventType: "OrderCreated",
		Payload: map[string]any{"order_id": 11}, Headers: map[string]string{"ignored": "no headers column"}}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.WriteBatch(ctx, outboxpgx.Tx(tx), []outbox.Event{ev, orderEvent("11", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := e.db.QueryRow(ctx, "SELECT tracingspancontext FROM outboxevent WHERE id = $1", ids[0]).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != "traceparent="+w3c(sc) {
		t.Errorf("tracingspancontext = %q, want Java properties text traceparent=%s", stored, w3c(sc))
	}
	recs := c.waitIDs(strs(ids...), 30*time.Second)
	if got := keyOrder(recs, "11"); !slices.Equal(got, strs(ids...)) {
		t.Errorf("order %v, want %v", got, ids)
	}
	r := byID(recs)[ids[0].String()]
	for k, v := range map[string]any{"message_id": ids[0].String(), "event_type": "OrderCreated", "aggregate_type": "order",
		"aggregate_id": "11", "schema_version": 1.0} {
		if r.Env[k] != v {
			t.Errorf("envelope %s = %v, want %v", k, r.Env[k], v)
		}
	}
	if src, _ := r.Env["source"].(map[string]any); src["table"] != "public.outboxevent" {
		t.Errorf("source = %v", r.Env["source"])
	}
	if fmt.Sprint(r.Env["payload"]) != "map[order_id:11]" || fmt.Sprint(r.Env["headers"]) != "map[]" {
		t.Errorf("payload %v headers %v", r.Env["payload"], r.Env["headers"])
	}
	t.Run("trace", func(t *testing.T) {
		// Debezium stores Java properties text in tracingspancontext; the
		// relay takes the traceparent key from it.
		if r.Env["trace_id"] != sc.TraceID().String() {
			t.Errorf("trace_id %v, want %s", r.Env["trace_id"], sc.TraceID())
		}
		if r.Env["traceparent"] != w3c(sc) || r.Headers["traceparent"] != w3c(sc) {
			t.Errorf("traceparent %v / header %q, want %s", r.Env["traceparent"], r.Headers["traceparent"], w3c(sc))
		}
	})
}

// TestProducerInvalidEventWritesNothing: an invalid event is refused before
// any statement, so the caller's transaction stays usable and nothing of
// it is stored, through pgx and through database/sql.
func TestProducerInvalidEventWritesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	bad := []outbox.Event{
		{AggregateType: "", AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{}`)},
		{AggregateType: "order", AggregateID: "", EventType: "x", Payload: json.RawMessage(`{}`)},
		{AggregateType: "order", AggregateID: "1", EventType: "", Payload: json.RawMessage(`{}`)},
		{AggregateType: "order", AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{"a":`)},
		{AggregateType: "order", AggregateID: "1", EventType: "x", Payload: "not json"},
		{AggregateType: "order", AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{"a":"\u0000"}`)},
		{AggregateType: "order", AggregateID: "1", EventType: "x"},
	}
	// A statement that got through would show as a row, as a message in a
	// decoding slot, or as an aborted transaction; check all three.
	try := func(t *testing.T, db outbox.Execer) {
		for i, ev := range bad {
			if _, err := outbox.Write(ctx, db, ev); !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Errorf("Write(bad %d) = %v, want ErrInvalidEvent", i, err)
			}
			if _, err := outbox.Emit(ctx, db, ev); !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Errorf("Emit(bad %d) = %v, want ErrInvalidEvent", i, err)
			}
			if _, err := outbox.WriteBatch(ctx, db, []outbox.Event{orderEvent("1", 0), ev}); !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Errorf("WriteBatch(good, bad %d) = %v, want ErrInvalidEvent", i, err)
			}
		}
		// The transaction is not aborted: a valid event still goes in.
		if _, err := outbox.Write(ctx, db, orderEvent("1", 1)); err != nil {
			t.Fatalf("valid Write after refused ones: %v", err)
		}
	}
	rows := func() int {
		var n int
		if err := e.db.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Messages would show in a logical decoding slot: watch one.
	e.exec("SELECT pg_create_logical_replication_slot('producer_test', 'test_decoding')")
	t.Cleanup(func() { e.db.Exec(context.Background(), "SELECT pg_drop_replication_slot('producer_test')") })

	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	try(t, outboxpgx.Tx(tx))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	sqlDB, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	stx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	try(t, stx)
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 2 {
		t.Errorf("outbox has %d rows, want the 2 valid ones", n)
	}
	decoded, err := e.db.Query(ctx, "SELECT data FROM pg_logical_slot_get_changes('producer_test', NULL, NULL)")
	if err != nil {
		t.Fatal(err)
	}
	changes, err := pgx.CollectRows(decoded, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	inserts := 0
	for _, ch := range changes {
		if strings.HasPrefix(ch, "message:") {
			t.Errorf("a refused Emit reached the WAL: %s", ch)
		}
		if strings.Contains(ch, "INSERT") {
			inserts++
		}
	}
	if inserts != 2 {
		t.Errorf("%d inserts decoded, want 2:\n%s", inserts, strings.Join(changes, "\n"))
	}
}

// TestProducerExamples runs examples/producer and examples/consumer with the
// relay between them: the consumer processes the event the producer wrote
// through its inbox, in the consumer's database,
// in the producer's trace.
func TestProducerExamples(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"producer", "consumer"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, name), "../examples/"+name)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build examples/%s: %v\n%s", name, err, out)
		}
	}
	e := newEnv(t)
	p := e.start()
	p.waitLog(`"streaming"`, 30*time.Second)

	out, err := exec.CommandContext(t.Context(), filepath.Join(dir, "producer"), "-database-url", e.dbURL, "-order-id", "77").CombinedOutput()
	if err != nil {
		t.Fatalf("producer: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`trace_id=([0-9a-f]{32})\norder 77 placed: message_id=([0-9a-f-]{36})\n`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("producer printed %q", out)
	}
	traceID, msgID := m[1], m[2]

	consumer := exec.Command(filepath.Join(dir, "consumer"), "-brokers", e.brokers, "-topic", "outbox.order", "-database-url", e.dbURL, "-v")
	var cout syncBuffer
	consumer.Stdout, consumer.Stderr = &cout, &cout
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		exited <- consumer.Wait()
		close(stopped)
	}()
	t.Cleanup(func() {
		_ = consumer.Process.Kill()
		<-stopped
	})
	// jsonb keeps the payload's content, not its key order.
	want := "processed " + msgID + " order.created aggregate=order/77 trace_id=" + traceID +
		` payload={"total": "99.90", "customer": "acme", "order_id": 77}`
	deadline := time.After(30 * time.Second)
	for !strings.Contains(cout.String(), want) {
		select {
		case err := <-exited:
			t.Fatalf("consumer exited: %v\n%s", err, cout.String())
		case <-deadline:
			t.Fatalf("consumer did not print %q within 30s:\n%s", want, cout.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	_ = consumer.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("consumer exited with %v after SIGTERM\n%s", err, cout.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("consumer did not stop after SIGTERM")
	}
}

// TestProducerSchemasKeepTransactionUsable: with outbox.Schemas, an event
// whose payload breaks its schema is refused before any statement, and the
// caller's transaction goes on: its business change and a valid event
// commit.
func TestProducerSchemasKeepTransactionUsable(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	set, err := schema.Load("../outbox/schema/testdata/schemas")
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Schemas(set))
	if err != nil {
		t.Fatal(err)
	}
	e.exec("CREATE TABLE orders (id int PRIMARY KEY)")
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	bad := outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: json.RawMessage(`{"order_id": 42, "total": 99.9}`)}
	var verr *schema.ValidationError
	_, err = w.Write(ctx, outboxpgx.Tx(tx), bad)
	if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &verr) {
		t.Fatalf("Write(invalid payload) = %v, want ErrInvalidEvent with the schema error", err)
	}
	if !strings.Contains(err.Error(), `at "/total"`) {
		t.Errorf("error %v does not name the failing pointer", err)
	}
	good := bad
	good.Payload = json.RawMessage(`{"order_id": 42, "total": "99.90"}`)
	id, err := w.Write(ctx, outboxpgx.Tx(tx), good)
	if err != nil {
		t.Fatalf("valid Write after the refused one: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after a refused event: %v", err)
	}
	var n int
	var got string
	if err := e.db.QueryRow(ctx, "SELECT count(*), max(id::text) FROM outbox").Scan(&n, &got); err != nil {
		t.Fatal(err)
	}
	if n != 1 || got != id.String() {
		t.Fatalf("outbox has %d rows (%s), want only the valid event %s", n, got, id)
	}
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n); err != nil || n != 1 {
		t.Fatalf("business change: %d rows, %v", n, err)
	}
}
