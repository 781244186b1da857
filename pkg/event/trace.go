package event

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// w3c is used directly rather than the process-wide propagator: the envelope
// stores a W3C traceparent whatever else a program propagates, and these
// functions must work before (or without) any tracing setup.
var w3c propagation.TraceContext

// TraceparentFromContext returns the W3C traceparent of the span in ctx, or
// "" when ctx carries no valid span context. It is what a producer stores in
// Envelope.Traceparent so that the event's consumers continue its trace.
func TraceparentFromContext(ctx context.Context) string {
	var carrier traceparentOnly
	w3c.Inject(ctx, &carrier)
	return carrier.value
}

// ContextWithTraceparent returns ctx with the trace context traceparent
// encodes as its remote parent, so the next span started from it continues
// that trace. An empty or malformed traceparent leaves ctx as it is: the next
// span starts a new trace.
func ContextWithTraceparent(ctx context.Context, traceparent string) context.Context {
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
	if key == HeaderTraceparent {
		return c.value
	}
	return ""
}

func (c *traceparentOnly) Set(key, value string) {
	if key == HeaderTraceparent {
		c.value = value
	}
}

func (c *traceparentOnly) Keys() []string { return []string{HeaderTraceparent} }
