package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/cdc"
	"github.com/outboxrelay/outboxrelay/envelope"
)

const (
	rowTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	rowSpanID      = "00f067aa0ba902b7"
	rowTraceparent = "00-" + rowTraceID + "-" + rowSpanID + "-01"
)

// traceSource hands the relay one transaction of table-less messages: "with"
// carries the row traceparent and a tracestate header, "without" has
// neither, "flaky" has neither and fails its first attempt.
type traceSource struct{}

func (traceSource) Run(ctx context.Context, h cdc.Handler) error {
	if err := h.Start(ctx, 0); err != nil {
		return err
	}
	_ = h.Begin(ctx, cdc.Begin{FinalLSN: 100})
	for i, c := range []string{
		`{"id":"with","aggregate_type":"order","aggregate_id":"1","event_type":"x","payload":{},"traceparent":"` + rowTraceparent + `","headers":{"tracestate":"vendor=abc","tenant":"acme"}}`,
		`{"id":"without","aggregate_type":"order","aggregate_id":"2","event_type":"x","payload":{}}`,
		`{"id":"flaky","aggregate_type":"order","aggregate_id":"3","event_type":"x","payload":{}}`,
	} {
		if err := h.Message(ctx, &cdc.LogicalMessage{Transactional: true, LSN: cdc.LSN(10 + i), Prefix: "outboxrelay", Content: []byte(c)}); err != nil {
			return err
		}
	}
	_ = h.Commit(ctx, cdc.Commit{EndLSN: 200})
	return h.Drain(ctx)
}

// sent is what a sink saw of one message.
type sent struct {
	traceparent, tracestate string
	env                     map[string]any
}

// traceSink records the trace context of every successful publish and sets
// the destination, as a real sink does. It fails the first attempt of the
// message "flaky". It tests what the relay hands a sink, not delivery.
type traceSink struct {
	mu     sync.Mutex
	failed bool
	got    map[string]sent
}

func (s *traceSink) Publish(_ context.Context, m *Message, done func(*Message, error)) {
	m.Destination = "outbox." + m.AggregateType
	s.mu.Lock()
	if m.ID == "flaky" && !s.failed {
		s.failed = true
		s.mu.Unlock()
		done(m, errors.New("connection reset"))
		return
	}
	var env map[string]any
	_ = json.Unmarshal(m.Envelope, &env)
	s.got[m.ID] = sent{m.Traceparent, m.Tracestate, env}
	s.mu.Unlock()
	done(m, nil)
}
func (s *traceSink) Ready() bool  { return true }
func (s *traceSink) Close() error { return nil }

func runTraced(t *testing.T, tracer trace.Tracer) map[string]sent {
	t.Helper()
	s := &traceSink{got: map[string]sent{}}
	r := New(Config{RetryMin: 10 * time.Millisecond, MessagingSystem: "kafka"}, s, nil, Options{Tracer: tracer})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx, traceSource{}); err != nil {
		t.Fatal(err)
	}
	if len(s.got) != 3 {
		t.Fatalf("published %v, want with, without and flaky", s.got)
	}
	for id, m := range s.got {
		if m.env["traceparent"] != m.traceparent || m.env["trace_id"] != m.traceparent[3:35] {
			t.Errorf("%s: envelope traceparent %v, trace_id %v; header %s", id, m.env["traceparent"], m.env["trace_id"], m.traceparent)
		}
	}
	return s.got
}

func spansByID(t *testing.T, exp *tracetest.InMemoryExporter) map[string]tracetest.SpanStub {
	t.Helper()
	out := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				if _, dup := out[a.Value.AsString()]; dup {
					t.Errorf("two spans for message %s", a.Value.AsString())
				}
				out[a.Value.AsString()] = s
			}
		}
	}
	return out
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// TestProducerSpans: with a sampling tracer every message gets one producer
// span, a child of the row's traceparent when it has one and a root
// otherwise; the message and its envelope carry the span's context, with
// the row's tracestate kept; failed attempts are events on that one span.
func TestProducerSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithIDGenerator(IDGenerator()))
	defer tp.Shutdown(context.Background())
	got := runTraced(t, tp.Tracer("test"))
	spans := spansByID(t, exp)
	if len(spans) != 3 {
		t.Fatalf("%d spans for 3 messages: %v", len(spans), spans)
	}
	for id, s := range spans {
		if s.SpanKind != trace.SpanKindProducer || s.Name != "send outbox.order" {
			t.Errorf("%s: span %q of kind %v, want a producer span named send outbox.order", id, s.Name, s.SpanKind)
		}
		if want := traceparentOf(s.SpanContext); got[id].traceparent != want {
			t.Errorf("%s: message carries %s, want its span's %s", id, got[id].traceparent, want)
		}
	}

	with := spans["with"]
	if with.Parent.TraceID().String() != rowTraceID || with.Parent.SpanID().String() != rowSpanID || !with.Parent.IsRemote() {
		t.Errorf("span of a row with a traceparent has parent %v, want the row's %s", with.Parent, rowTraceparent)
	}
	if with.SpanContext.TraceID().String() != rowTraceID {
		t.Errorf("span of a row with a traceparent is in trace %s, want the row's", with.SpanContext.TraceID())
	}
	if got["with"].tracestate != "vendor=abc" {
		t.Errorf("tracestate %q, want the row's vendor=abc", got["with"].tracestate)
	}
	for _, id := range []string{"without", "flaky"} {
		if spans[id].Parent.IsValid() {
			t.Errorf("%s: span of a row without a traceparent has parent %v, want a root", id, spans[id].Parent)
		}
		if !strings.HasSuffix(got[id].traceparent, "-01") {
			t.Errorf("%s: traceparent %s of a sampled span is not flagged sampled", id, got[id].traceparent)
		}
		// Every delivery of the message is in one trace, as without tracing.
		if derived, _ := envelope.Trace("", id); spans[id].SpanContext.TraceID().String() != derived {
			t.Errorf("%s: root span in trace %s, want the derived %s", id, spans[id].SpanContext.TraceID(), derived)
		}
	}
	if ev := spans["flaky"].Events; len(ev) != 1 || ev[0].Name != "publish failed" {
		t.Errorf("flaky: events %v, want one publish failed", ev)
	}
}

// TestUnsampledSpansLeaveTraceContext: spans that are not sampled are not
// exported, so the messages keep the row's context, or the derived one,
// which is not flagged sampled: no consumer sees a sampled parent that
// never existed. Without a tracer it is the same.
func TestUnsampledSpansLeaveTraceContext(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.NeverSample()))
	defer tp.Shutdown(context.Background())
	for name, tracer := range map[string]trace.Tracer{"never sampled": tp.Tracer("test"), "no tracer": nil} {
		got := runTraced(t, tracer)
		if got["with"].traceparent != rowTraceparent || got["with"].tracestate != "vendor=abc" {
			t.Errorf("%s: row with a traceparent: sent %s %q, want the row's", name, got["with"].traceparent, got["with"].tracestate)
		}
		for _, id := range []string{"without", "flaky"} {
			if tp := got[id].traceparent; !strings.HasSuffix(tp, "-00") {
				t.Errorf("%s: %s: derived traceparent %s is flagged sampled; no span with its id was recorded", name, id, tp)
			}
		}
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans exported with a sampler that samples nothing", n)
	}
}
