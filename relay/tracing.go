package relay

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/envelope"
)

// The relay's producer spans, one per message, follow the OpenTelemetry
// messaging conventions: kind producer, named "send <destination>", with
// messaging.system, messaging.operation.*, messaging.message.id and
// messaging.destination.name. A span starts when the relay builds the
// message (its context is what the message carries, in the envelope and the
// traceparent header, so it must exist before the body is encoded) and ends
// when the broker acknowledges the message, when it is stored as a dead
// letter, or when the relay stops before either. Failed attempts are events
// on the span, so one message is one span however often it is tried.

var traceContext propagation.TraceContext

// traceCarrier is a TextMapCarrier of just the two trace context fields.
type traceCarrier struct{ traceparent, tracestate string }

func (c *traceCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.traceparent
	case "tracestate":
		return c.tracestate
	}
	return ""
}

func (c *traceCarrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.traceparent = value
	case "tracestate":
		c.tracestate = value
	}
}

func (c *traceCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// startSpan starts m's producer span when the relay has a tracer, and, when
// the span is sampled, makes its context the one m and em carry (the trace
// id stays the row's when the row has a valid traceparent). fromRow says that
// m.Traceparent (and m.Tracestate) are the row's own: the span is then its
// child; otherwise the span is a root, so that a consumer's trace never
// points at a parent nobody recorded.
//
// With a tracer that records nothing (the OpenTelemetry no-op, or a
// provider without an exporter) the span context is the parent's or
// invalid, and m keeps the values it has: the row's trace context, or the
// derived, unsampled one.
func (b *Builder) startSpan(m *Message, em *envelope.Message, fromRow bool) {
	if b.cfg.Tracer == nil {
		return
	}
	ctx := context.Background() // a message has no caller context: its parent, if any, is the row's
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", b.cfg.MessagingSystem),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.message.id", m.ID),
		),
	}
	var parent trace.SpanContext
	if fromRow {
		ctx = traceContext.Extract(ctx, &traceCarrier{m.Traceparent, m.Tracestate})
		parent = trace.SpanContextFromContext(ctx)
	} else {
		opts = append(opts, trace.WithNewRoot())
		if id, err := trace.TraceIDFromHex(em.TraceID); err == nil {
			ctx = context.WithValue(ctx, derivedTraceKey{}, id)
		}
	}
	_, span := b.cfg.Tracer.Start(ctx, "send", opts...)
	sc := span.SpanContext()
	if !sc.IsValid() || sc.SpanID() == parent.SpanID() {
		// A tracer that makes no spans of its own.
		span.End()
		return
	}
	m.span = span
	if !sc.IsSampled() {
		// Nothing of this span is exported: pointing consumers at it would
		// hang their spans on a parent nobody can see. The message keeps
		// the row's context, or the derived unsampled one, which are also
		// the same on every delivery.
		return
	}
	var out traceCarrier
	traceContext.Inject(trace.ContextWithSpanContext(ctx, sc), &out)
	m.Traceparent, m.Tracestate = out.traceparent, out.tracestate
	em.Traceparent, em.TraceID = out.traceparent, sc.TraceID().String()
}

// spanFailed records a failed attempt on m's span.
func spanFailed(m *Message, err error) {
	if m.span != nil {
		m.span.AddEvent("publish failed", trace.WithAttributes(
			attribute.Int("outboxrelay.attempt", m.Attempts),
			attribute.String("error.message", err.Error())))
	}
}

// endSpan ends m's span: published when err is nil, else failed with err
// (dead-lettered, or not acknowledged before the relay stopped).
func endSpan(m *Message, err error) {
	span := m.span
	if span == nil {
		return
	}
	m.span = nil
	if m.Destination != "" {
		// A dead letter's destination may be the invalid UTF-8 the sink
		// refused; an exporter cannot encode it.
		dest := strings.ToValidUTF8(m.Destination, "\uFFFD")
		span.SetName("send " + dest)
		span.SetAttributes(attribute.String("messaging.destination.name", dest))
	}
	if m.Attempts > 0 {
		span.SetAttributes(attribute.Int("outboxrelay.failed_attempts", m.Attempts))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

type derivedTraceKey struct{}

// IDGenerator makes the ids of the relay's spans. A root span, the span of
// a row without a valid traceparent, gets the trace id the envelope
// derives from the message id, so that every delivery of the message,
// replays included, is in one trace, as it is with tracing off; every
// other id is random. Pass it to the tracer provider
// (sdktrace.WithIDGenerator); it is safe for concurrent use.
func IDGenerator() interface {
	NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID)
	NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID
} {
	return idGenerator{}
}

type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	id, ok := ctx.Value(derivedTraceKey{}).(trace.TraceID)
	for !ok || !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
		ok = true
	}
	return id, randomSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return randomSpanID() }

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}
