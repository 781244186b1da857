package tracing_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/platform/tracing"
)

func TestSetupRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]tracing.Config{
		"exporter": {Exporter: "jaeger"},
		"endpoint": {Exporter: "otlp", Endpoint: "localhost:4318"},
		"sampler":  {Exporter: "none", Sampler: "sometimes"},
		"ratio":    {Exporter: "none", Sampler: "traceidratio", SamplerArg: 1.5},
	} {
		if _, err := tracing.Setup(context.Background(), cfg, "test", slog.Default()); err == nil {
			t.Errorf("%s: Setup accepted %+v", name, cfg)
		}
	}
}

// With the otlp exporter, Setup's provider sends spans to the collector
// under the service's name, and Shutdown flushes what is still buffered.
func TestSetupExportsOverOTLP(t *testing.T) {
	collector := testinfra.NewOTLPReceiver(t)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{
		Exporter: "otlp", Endpoint: collector.URL + "/", Sampler: "parentbased_always_on", SamplerArg: 1,
	}, "unit-test", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(event.ContextWithTraceparent(context.Background(), testinfra.CallerTraceparent), "exported",
		trace.WithSpanKind(trace.SpanKindConsumer))
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := collector.Spans()
	if len(spans) != 1 {
		t.Fatalf("collector got %d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Service != "unit-test" || s.Name != "exported" || s.TraceID != testinfra.CallerTraceID || s.ParentSpanID != testinfra.CallerSpanID ||
		s.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Fatalf("collector got %+v", s)
	}
}

// Setup with the none exporter leaves the provider alone.
func TestSetupNoneInstallsNoProvider(t *testing.T) {
	rec := testinfra.RecordSpans(t)
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Exporter: "none"}, "test", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "kept")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()); n != 1 {
		t.Fatalf("the installed provider saw %d spans, want 1", n)
	}
}
