package integration

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxrelay/outboxrelay/envelope"
)

// otlpCollector is an OTLP/HTTP traces endpoint that decodes what it
// receives with the protocol's own protobuf definitions.
type otlpCollector struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPCollector(t *testing.T) *otlpCollector {
	c := &otlpCollector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var req coltrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			t.Errorf("OTLP request does not decode: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// span waits for the span whose messaging.message.id is id.
func (c *otlpCollector) span(t *testing.T, id string) *tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, s := range c.spans {
			for _, a := range s.Attributes {
				if a.Key == "messaging.message.id" && a.Value.GetStringValue() == id {
					c.mu.Unlock()
					return s
				}
			}
		}
		c.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no span for message %s exported within 20s", id)
	return nil
}

// TestTraceparentFlags: through the relay binary, a row without a
// traceparent reaches Kafka with a derived traceparent that is not flagged
// sampled when tracing is off, and with the relay's own sampled producer
// span, exported over OTLP/HTTP, when it is on; a row with a traceparent
// keeps it (off) or gets a child span of it with its tracestate (on).
func TestTraceparentFlags(t *testing.T) {
	const rowTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	insert := func(e *env) (without, with string) {
		if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', '1', 'order.created', '{}') RETURNING id::text`).Scan(&without); err != nil {
			t.Fatal(err)
		}
		if err := e.db.QueryRow(t.Context(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, traceparent, headers)
			VALUES ('order', '2', 'order.created', '{}', $1, '{"tracestate": "vendor=abc"}') RETURNING id::text`, rowTP).Scan(&with); err != nil {
			t.Fatal(err)
		}
		return without, with
	}
	byID := func(recs []record) map[string]record {
		m := map[string]record{}
		for _, r := range recs {
			m[r.Headers["message_id"]] = r
		}
		return m
	}

	t.Run("off", func(t *testing.T) {
		e := newEnv(t)
		c := e.consume("outbox.order")
		p := e.start()
		p.waitLog(`"streaming"`, 30*time.Second)
		without, with := insert(e)
		got := byID(c.waitIDs([]string{without, with}, 30*time.Second))
		p.stop()
		if tp := got[without].Headers["traceparent"]; !strings.HasSuffix(tp, "-00") || got[without].Env["traceparent"] != tp {
			t.Errorf("derived traceparent %q (envelope %v), want one flagged not sampled (-00)", tp, got[without].Env["traceparent"])
		}
		if tp := got[with].Headers["traceparent"]; tp != rowTP || got[with].Headers["tracestate"] != "vendor=abc" {
			t.Errorf("row traceparent came out as %q, tracestate %q", tp, got[with].Headers["tracestate"])
		}
	})

	t.Run("otlp", func(t *testing.T) {
		col := newOTLPCollector(t)
		e := newEnv(t)
		c := e.consume("outbox.order")
		p := e.start("OTEL_EXPORTER_OTLP_ENDPOINT="+col.srv.URL, "OTEL_TRACES_SAMPLER=always_on", "OTEL_BSP_SCHEDULE_DELAY=100")
		p.waitLog(`"streaming"`, 30*time.Second)
		without, with := insert(e)
		got := byID(c.waitIDs([]string{without, with}, 30*time.Second))
		root, child := col.span(t, without), col.span(t, with)
		p.stop()
		check := func(id string, s *tracepb.Span) string {
			tp := got[id].Headers["traceparent"]
			want := "00-" + hex.EncodeToString(s.TraceId) + "-" + hex.EncodeToString(s.SpanId) + "-01"
			if tp != want || got[id].Env["traceparent"] != tp {
				t.Errorf("message %s carries %q (envelope %v), want its exported span's %s", id, tp, got[id].Env["traceparent"], want)
			}
			if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || s.Name != "send outbox.order" {
				t.Errorf("message %s: span %q of kind %v", id, s.Name, s.Kind)
			}
			return tp
		}
		check(without, root)
		check(with, child)
		if len(root.ParentSpanId) != 0 {
			t.Errorf("span of a row without a traceparent has parent %x, want a root", root.ParentSpanId)
		}
		if derived, _ := envelope.Trace("", without); hex.EncodeToString(root.TraceId) != derived {
			t.Errorf("root span in trace %x, want the one derived from the message id, %s", root.TraceId, derived)
		}
		if hex.EncodeToString(child.TraceId) != rowTP[3:35] || hex.EncodeToString(child.ParentSpanId) != rowTP[36:52] {
			t.Errorf("span of a row with a traceparent: trace %x parent %x, want the row's", child.TraceId, child.ParentSpanId)
		}
		if got[with].Headers["tracestate"] != "vendor=abc" || child.TraceState != "vendor=abc" {
			t.Errorf("tracestate: header %q, span %q; want the row's vendor=abc", got[with].Headers["tracestate"], child.TraceState)
		}
	})
}
