// Package tracectx carries W3C trace context across the places where the
// platform breaks a call chain: an outbox row and a Kafka message (as the
// event envelope's traceparent string), and an outgoing HTTP request
// (Transport). It uses only the OpenTelemetry API, so libraries can import it
// without the SDK; the process-wide tracer provider that makes its spans real
// is installed by package tracing's Setup.
package tracectx

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TraceparentHeader is the W3C header (and Kafka header) that carries a
// trace context.
const TraceparentHeader = "traceparent"

// w3c is used directly rather than the process-wide propagator: the envelope
// stores a W3C traceparent whatever else a program propagates, and these
// helpers must work before (or without) tracing.Setup.
var w3c propagation.TraceContext

// Traceparent returns the W3C traceparent of the span in ctx, or "" when
// ctx carries no valid span context. It is what a producer stores in an
// event's envelope so that the event's consumers continue its trace.
func Traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	return carrier[TraceparentHeader]
}

// WithTraceparent returns ctx with the trace context traceparent
// encodes as its remote parent, so the next span started from it continues
// that trace. An empty or malformed traceparent leaves ctx as it is: the next
// span starts a new trace.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier{TraceparentHeader: traceparent})
}

// End ends span, first marking it failed with err when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
