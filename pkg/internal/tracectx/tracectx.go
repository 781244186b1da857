// Package tracectx ends the libraries' spans. The trace context itself
// travels as the envelope's traceparent (event.TraceparentFromContext,
// event.ContextWithTraceparent). It uses only the OpenTelemetry API, so the
// libraries make real spans only where the process installed a tracer
// provider.
package tracectx

import (
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// End ends span, first marking it failed with err when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
