package app

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/outboxrelay/outboxrelay/relay"
)

// tracing is the relay's OpenTelemetry tracer provider, or nothing.
type tracing struct {
	provider *sdktrace.TracerProvider // nil: tracing is off
}

// Tracer returns the relay's tracer, or nil when tracing is off: the relay
// then starts no spans at all.
func (t tracing) Tracer() trace.Tracer {
	if t.provider == nil {
		return nil
	}
	return t.provider.Tracer("github.com/outboxrelay/outboxrelay/relay")
}

// Shutdown exports the spans still buffered and stops the exporter.
func (t tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// newTracing sets up tracing from the standard OpenTelemetry environment
// variables, read through lookup. It is off unless OTEL_TRACES_EXPORTER is
// otlp or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, and always off with
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The exporter speaks
// OTLP over HTTP (http/protobuf) and reads the other OTEL_EXPORTER_OTLP_*
// variables itself (headers, TLS, timeout, compression); the sampler
// follows OTEL_TRACES_SAMPLER (default parentbased_always_on) and the
// resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with
// service.name outboxrelay unless they say otherwise, and service.version
// version.
//
// Nothing is sent until spans end; an unreachable collector is logged by
// the exporter and never stops the relay.
func newTracing(ctx context.Context, lookup func(string) (string, bool), version string, log *zap.Logger) (tracing, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return tracing{}, nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return tracing{}, nil
	case "":
		if get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return tracing{}, nil
		}
	case "otlp":
	default:
		return tracing{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%s is not supported; set it to otlp or none", exp)
	}
	protocol := get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if protocol != "" && protocol != "http/protobuf" {
		return tracing{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported; the relay exports OTLP over HTTP: set it to http/protobuf and point the endpoint at the collector's HTTP port (4318)", protocol)
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return tracing{}, fmt.Errorf("OpenTelemetry exporter: %v; check the OTEL_EXPORTER_OTLP_* variables", err)
	}
	fromEnv, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES still yields the rest.
		log.Warn("OpenTelemetry resource attributes are partly invalid; check OTEL_RESOURCE_ATTRIBUTES", zap.Error(err))
	}
	res, err := resource.Merge(resource.NewSchemaless(
		attribute.String("service.name", "outboxrelay"),
		attribute.String("service.version", version),
	), fromEnv)
	if err != nil {
		return tracing{}, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("OpenTelemetry", zap.Error(err))
	}))
	log.Info("OpenTelemetry tracing on", zap.String("exporter", "otlp http/protobuf"))
	return tracing{provider: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(relay.IDGenerator()))}, nil
}
