package testenv

import (
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

// The trace context of a traced caller, for tests that hand one to the code
// under test: a W3C traceparent and the trace and span ids in it.
const (
	CallerTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	CallerSpanID      = "00f067aa0ba902b7"
	CallerTraceparent = "00-" + CallerTraceID + "-" + CallerSpanID + "-01"
)

// RecordSpans installs an in-memory tracer provider process-wide for the
// test and a no-op one after it (OpenTelemetry's initial provider cannot be
// put back: it keeps delegating to the first provider ever installed).
// Every span the process starts meanwhile is recorded, so a test that uses
// it must not run in parallel with others that start spans, or must pick
// its spans out by trace id.
func RecordSpans(t testing.TB) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	return rec
}
