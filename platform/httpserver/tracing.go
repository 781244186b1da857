package httpserver

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerScope names this package's spans (the instrumentation scope).
const tracerScope = "github.com/onceflow/onceflow/platform/httpserver"

// w3c reads the caller's trace context from the request's traceparent
// header whatever the process-wide propagator is, as the envelope's
// traceparent is (event.TraceparentFromContext).
var w3c propagation.TraceContext

// TracingMiddleware returns echo middleware that makes each request a
// server span, a child of the caller's trace context when the request
// carries a traceparent header, and puts the span in the request's context
// for the handlers. Requests for which skip returns true are not traced
// (nil: none is skipped). New installs it; it is exported for servers built
// without New.
func TracingMiddleware(skip func(echo.Context) bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if skip != nil && skip(c) {
				return next(c)
			}
			r := c.Request()
			ctx := w3c.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			route := c.Path() // the route pattern, so span names stay few
			name := r.Method
			if route != "" {
				name += " " + route
			}
			ctx, span := otel.GetTracerProvider().Tracer(tracerScope).Start(ctx, name,
				trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path),
					semconv.HTTPRoute(route)))
			defer span.End()
			c.SetRequest(r.WithContext(ctx))
			err := next(c)
			if err != nil {
				// Let the error handler write the response now, so the span
				// records the status the client gets.
				c.Error(err)
			}
			status := c.Response().Status
			span.SetAttributes(semconv.HTTPResponseStatusCode(status))
			if status >= http.StatusInternalServerError {
				span.SetStatus(codes.Error, http.StatusText(status))
			}
			return nil
		}
	}
}
