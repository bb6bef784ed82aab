package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/integration/pgserver"
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

// syncBuffer is written by the consumer's goroutines and read by the test.
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

// TestRunAppliesEachMessageOnce runs the example against kfake over TCP
// and a real PostgreSQL: a message delivered twice counts once, the
// handler's span continues the producer's trace, and a restarted consumer
// of the group resumes after what it committed, in either mode.
func TestRunAppliesEachMessageOnce(t *testing.T) {
	srv, err := pgserver.Start(t.Context(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	for _, batch := range []int{0, 8} {
		t.Run(map[int]string{0: "per message", 8: "batch"}[batch], func(t *testing.T) {
			testRun(t, srv, batch)
		})
	}
}

func testRun(t *testing.T, srv *pgserver.Server, batch int) {
	ctx := t.Context()
	dbURL, err := srv.CreateDatabase(ctx, strings.ReplaceAll(t.Name(), "/", "_"))
	if err != nil {
		t.Fatal(err)
	}
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
			if err := prod.ProduceSync(ctx, record(id)).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	o := Options{Brokers: cluster.ListenAddrs(), Topic: "outbox.order", Group: "g", DatabaseURL: dbURL, Batch: batch}
	consume := func(until string) string {
		t.Helper()
		var out syncBuffer
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, o, tp.Tracer("test"), &out) }()
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
		cancel() // Run drains and commits what it processed before it returns
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		return out.String()
	}
	events := func() int64 {
		t.Helper()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int64
		if err := conn.QueryRow(ctx, "SELECT events FROM order_event_counts WHERE order_id = '42'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	produce("a", "a", "b") // a twice: a relay restarted with kill -9 resends
	out := consume("processed b")
	want := "processed a order.created aggregate=order/42 trace_id=" + traceID + ` payload={"order_id":42}`
	if !strings.Contains(out, want) || !strings.Contains(out, "duplicate a") || strings.Count(out, "processed ") != 2 {
		t.Errorf("first run:\n%s\nwant a and b processed once, a's second delivery a duplicate", out)
	}
	if n := events(); n != 2 {
		t.Errorf("order 42 counted %d events, want 2", n)
	}
	produce("c")
	if out := consume("processed c"); strings.Contains(out, "processed a") || strings.Contains(out, "processed b") {
		t.Errorf("the restarted consumer processed again:\n%s", out)
	}
	if n := events(); n != 3 {
		t.Errorf("order 42 counted %d events after c, want 3", n)
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want one per handler run (3)", len(spans))
	}
	for _, s := range spans {
		if s.Parent().TraceID().String() != traceID || s.Parent().SpanID().String() != "00f067aa0ba902b7" || !s.Parent().IsRemote() {
			t.Errorf("span %s has parent %v, want the producer's span from traceparent", s.Name(), s.Parent())
		}
		if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process order.created" {
			t.Errorf("span %s: kind %s", s.Name(), s.SpanKind())
		}
	}
}
