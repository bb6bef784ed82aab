package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceparent = "00-" + traceID + "-00f067aa0ba902b7-01"
)

func record(id string) *kgo.Record {
	return &kgo.Record{
		Topic: "outbox.order", Key: []byte("42"),
		Value: []byte(`{"envelope_version":1,"message_id":"` + id + `","event_type":"order.created","aggregate_type":"order",` +
			`"aggregate_id":"42","trace_id":"` + traceID + `","traceparent":"` + traceparent + `","payload":{"order_id":42},"new_field":1}`),
		Headers: []kgo.RecordHeader{{Key: "message_id", Value: []byte(id)}, {Key: "traceparent", Value: []byte(traceparent)}},
	}
}

// syncBuffer is written by the consumer goroutine and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestHandleDedupesAndContinuesTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var out syncBuffer
	h := &Handler{Seen: NewLRU(2), Tracer: tp.Tracer("test"), Out: &out}
	ctx := context.Background()
	for _, id := range []string{"a", "a", "b", "c", "a"} {
		if err := h.Handle(ctx, record(id)); err != nil {
			t.Fatal(err)
		}
	}
	// "a" was evicted by "b" and "c" (size 2): the LRU bounds memory, and a
	// redelivery older than its window is processed again. A processed-ids
	// table has no such window.
	want := "processed a order.created aggregate=order/42 trace_id=" + traceID + ` payload={"order_id":42}
duplicate a
processed b order.created aggregate=order/42 trace_id=` + traceID + ` payload={"order_id":42}
processed c order.created aggregate=order/42 trace_id=` + traceID + ` payload={"order_id":42}
processed a order.created aggregate=order/42 trace_id=` + traceID + ` payload={"order_id":42}
`
	if out.String() != want {
		t.Errorf("output\n%s\nwant\n%s", out.String(), want)
	}
	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want one per processed message", len(spans))
	}
	for _, s := range spans {
		if s.Parent().TraceID().String() != traceID || s.Parent().SpanID().String() != "00f067aa0ba902b7" || !s.Parent().IsRemote() {
			t.Errorf("span %s has parent %v, want the producer's span from traceparent", s.Name(), s.Parent())
		}
		if s.SpanContext().TraceID().String() != traceID || s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process order.created" {
			t.Errorf("span %s: trace %s kind %s", s.Name(), s.SpanContext().TraceID(), s.SpanKind())
		}
	}
	if err := h.Handle(ctx, &kgo.Record{Value: []byte("not json")}); err != nil {
		t.Errorf("undecodable record: %v", err)
	}
}

// TestRunCommitsAfterProcessing runs the example against a Kafka broker
// (kfake): duplicates are skipped, and a restarted consumer of the same
// group resumes after the committed offsets.
func TestRunCommitsAfterProcessing(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(ids ...string) {
		for _, id := range ids {
			if err := prod.ProduceSync(t.Context(), record(id)).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	consume := func(until string) string {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("g"),
			kgo.ConsumeTopics("outbox.order"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var out syncBuffer
		h := &Handler{Seen: NewLRU(100), Tracer: noop.NewTracerProvider().Tracer(""), Out: &out}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cl, h) }()
		deadline := time.After(30 * time.Second)
		for !strings.Contains(out.String(), until) {
			select {
			case err := <-done:
				t.Fatalf("Run returned %v\n%s", err, out.String())
			case <-deadline:
				t.Fatalf("no %q within 30s:\n%s", until, out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel() // Run commits what it processed before it returns
		<-done
		return out.String()
	}

	produce("a", "a", "b")
	first := consume("processed b")
	if strings.Count(first, "processed a") != 1 || !strings.Contains(first, "duplicate a") {
		t.Errorf("first run:\n%s", first)
	}
	produce("c")
	second := consume("processed c")
	if strings.Contains(second, "processed a") || strings.Contains(second, "processed b") {
		t.Errorf("second run reprocessed committed records:\n%s", second)
	}
}
