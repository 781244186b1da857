package tracing

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// scope names this package's spans (the instrumentation scope).
const scope = "github.com/onceflow/onceflow/pkg/platform/tracing"

// Middleware returns echo middleware that makes each request a server span,
// a child of the caller's trace context when the request carries a
// traceparent header, and puts the span in the request's context for the
// handlers. Requests for which skip returns true are not traced (nil: none
// is skipped).
func Middleware(skip func(echo.Context) bool) echo.MiddlewareFunc {
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
			ctx, span := otel.GetTracerProvider().Tracer(scope).Start(ctx, name,
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

// Transport returns an http.RoundTripper that makes each request a client
// span, a child of the request context's span, and sends that span's trace
// context in the traceparent header, so the server's span continues it. A
// nil base means http.DefaultTransport.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return transport{base: base}
}

type transport struct{ base http.RoundTripper }

func (t transport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := otel.GetTracerProvider().Tracer(scope).Start(r.Context(), r.Method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLFull(r.URL.Redacted()),
			semconv.ServerAddress(r.URL.Hostname())))
	r = r.Clone(ctx) // a RoundTripper must not change the caller's request
	w3c.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		End(span, err)
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= http.StatusBadRequest {
		span.SetStatus(codes.Error, fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode)))
	}
	span.End()
	return resp, nil
}
