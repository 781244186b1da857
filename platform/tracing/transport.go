package tracing

import (
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// transportScope names the client spans Transport makes (the
// instrumentation scope).
const transportScope = "github.com/onceflow/onceflow/platform/tracing"

// w3c is used directly rather than the process-wide propagator, as the
// envelope's traceparent is (event.TraceparentFromContext): a request carries
// a W3C traceparent whether or not Setup ran.
var w3c propagation.TraceContext

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
	ctx, span := otel.GetTracerProvider().Tracer(transportScope).Start(r.Context(), r.Method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLFull(r.URL.Redacted()),
			semconv.ServerAddress(r.URL.Hostname())))
	r = r.Clone(ctx) // a RoundTripper must not change the caller's request
	w3c.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= http.StatusBadRequest {
		span.SetStatus(codes.Error, fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode)))
	}
	span.End()
	return resp, nil
}
