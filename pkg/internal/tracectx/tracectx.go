// Package tracectx carries W3C trace context through an event: the
// envelope's traceparent string from and into a context, and the ending of a
// span with its error. It uses only the OpenTelemetry API, so the libraries
// make real spans only where the process installed a tracer provider.
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
	var carrier traceparentOnly
	w3c.Inject(ctx, &carrier)
	return carrier.value
}

// WithTraceparent returns ctx with the trace context traceparent
// encodes as its remote parent, so the next span started from it continues
// that trace. An empty or malformed traceparent leaves ctx as it is: the next
// span starts a new trace.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, &traceparentOnly{value: traceparent})
}

// traceparentOnly is a carrier of the traceparent alone (the envelope keeps
// no tracestate): a relay goes through it for every event it publishes,
// and a map per call was most of what tracing cost it.
type traceparentOnly struct{ value string }

func (c *traceparentOnly) Get(key string) string {
	if key == TraceparentHeader {
		return c.value
	}
	return ""
}

func (c *traceparentOnly) Set(key, value string) {
	if key == TraceparentHeader {
		c.value = value
	}
}

func (c *traceparentOnly) Keys() []string { return []string{TraceparentHeader} }

// End ends span, first marking it failed with err when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
