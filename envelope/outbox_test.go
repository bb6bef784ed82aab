package envelope_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxrelay/outboxrelay/envelope"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// These tests hold package outbox, a module of its own that cannot import
// the relay's packages, to what the relay reads: a traceparent the relay
// continues, and table-less content it parses.

// lastStatement is an outbox.Execer that keeps the last statement instead
// of running it.
type lastStatement struct {
	query string
	args  []any
}

func (l *lastStatement) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	l.query, l.args = query, args
	return driver.RowsAffected(1), nil
}

func order() outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Payload: json.RawMessage(`{"total":"99.90"}`)}
}

// TestOutboxTraceparentIsTheTrace: the relay takes the traceparent outbox
// stores from a span a real tracer started as the trace, sampled or not,
// rather than starting a new one.
func TestOutboxTraceparentIsTheTrace(t *testing.T) {
	for _, sampler := range []sdktrace.Sampler{sdktrace.AlwaysSample(), sdktrace.NeverSample()} {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler))
		ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
		var l lastStatement
		if _, err := outbox.Write(ctx, &l, order()); err != nil {
			t.Fatal(err)
		}
		stored, _ := l.args[6].(string)
		if id, got := envelope.Trace(stored, "x"); id != span.SpanContext().TraceID().String() || got != stored {
			t.Errorf("envelope.Trace(%q) = %s, %s; want trace %s", stored, id, got, span.SpanContext().TraceID())
		}
		span.End()
		_ = tp.Shutdown(context.Background())
	}
}

// TestOutboxEmitParses: what outbox.Emit writes is a table-less message the
// relay parses, field for field, instead of dead-lettering it.
func TestOutboxEmitParses(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()

	w, err := outbox.New(outbox.MessagePrefix("shop"))
	if err != nil {
		t.Fatal(err)
	}
	var l lastStatement
	e := order()
	e.Headers = map[string]string{"tenant": "acme"}
	e.SchemaVersion = 2
	id, err := w.Emit(ctx, &l, e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := envelope.ParseEmitted([]byte(l.args[1].(string)))
	if err != nil {
		t.Fatalf("the relay would dead-letter %s: %v", l.args[1], err)
	}
	want := envelope.Emitted{ID: id.String(), AggregateType: "order", AggregateID: "42", EventType: "order.created",
		Traceparent:   "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01",
		SchemaVersion: 2, Payload: []byte(`{"total":"99.90"}`), Headers: []byte(`{"tenant":"acme"}`)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("emitted\n got %+v\nwant %+v", got, want)
	}
}

// TestReservedHeaderAgreesWithRelay: the library refuses exactly the names
// the relay drops (envelope.Reserved), but tracestate, which the relay
// sends with the row's traceparent.
func TestReservedHeaderAgreesWithRelay(t *testing.T) {
	names := []string{"tenant", "x-id", "ids", "messageid", "ce", "cex", "cloudevents", "Tracestate", "tracestate"}
	for _, f := range envelope.ReservedForms() {
		base := strings.TrimSuffix(f, "*")
		names = append(names, base, strings.ToUpper(base), base+"x")
	}
	for _, n := range names {
		want := envelope.Reserved(n) && !strings.EqualFold(n, "tracestate")
		if got := outbox.ReservedHeader(n); got != want {
			t.Errorf("ReservedHeader(%q) = %v, the relay's rule says %v", n, got, want)
		}
	}
}
