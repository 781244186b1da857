package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/onceflow/onceflow/pkg/platform/testinfra"
	"github.com/onceflow/onceflow/pkg/platform/tracing"
)

// recordSpans installs an in-memory tracer provider process-wide for the
// test and restores the previous one after it.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	return rec
}

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID      = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + spanID + "-01"
)

func TestTraceparentRoundTrip(t *testing.T) {
	ctx := tracing.ContextWithTraceparent(context.Background(), traceparent)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != traceID || sc.SpanID().String() != spanID || !sc.IsSampled() {
		t.Fatalf("extracted %+v from %s", sc, traceparent)
	}
	if got := tracing.Traceparent(ctx); got != traceparent {
		t.Fatalf("Traceparent = %q, want %q", got, traceparent)
	}
}

func TestTraceparentOfNothing(t *testing.T) {
	for _, tp := range []string{
		"",
		"not a traceparent",
		"00-00000000000000000000000000000000-" + spanID + "-01", // all-zero trace id is invalid
		"00-" + traceID + "-0000000000000000-01",                // all-zero span id is invalid
		"00-" + traceID + "-" + spanID,                          // flags missing
	} {
		ctx := tracing.ContextWithTraceparent(context.Background(), tp)
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("%q gave a valid span context %v", tp, sc)
		}
		if got := tracing.Traceparent(ctx); got != "" {
			t.Errorf("%q: Traceparent = %q, want empty", tp, got)
		}
	}
}

// A child span started from the extracted context belongs to the same trace
// and names the traceparent's span as its parent; its own traceparent is what
// the next hop receives.
func TestContinuingATraceparent(t *testing.T) {
	rec := recordSpans(t)
	ctx, span := otel.Tracer("test").Start(tracing.ContextWithTraceparent(context.Background(), traceparent), "child")
	next := tracing.Traceparent(ctx)
	tracing.End(span, errors.New("boom"))

	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	s := ended[0]
	if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != spanID {
		t.Fatalf("child span is in trace %s under %s", s.SpanContext().TraceID(), s.Parent().SpanID())
	}
	if want := "00-" + traceID + "-" + s.SpanContext().SpanID().String() + "-01"; next != want {
		t.Fatalf("child traceparent = %q, want %q", next, want)
	}
	if s.Status().Code != codes.Error || len(s.Events()) != 1 {
		t.Fatalf("End with an error: status %v, %d events", s.Status(), len(s.Events()))
	}
}

// Without a tracer provider (the "none" exporter), a span started from an
// incoming context carries that context on unchanged.
func TestNoProviderPassesTheCallersContextThrough(t *testing.T) {
	ctx, span := noop.NewTracerProvider().Tracer("test").Start(tracing.ContextWithTraceparent(context.Background(), traceparent), "x")
	defer span.End()
	if got := tracing.Traceparent(ctx); got != traceparent {
		t.Fatalf("Traceparent = %q, want the caller's %q", got, traceparent)
	}
}

// The server middleware continues the caller's trace and hands its span to
// the handler; the client transport sends its own span's context, so a call
// through both makes a parent chain client -> server.
func TestMiddlewareAndTransport(t *testing.T) {
	rec := recordSpans(t)
	e := echo.New()
	e.Use(tracing.Middleware(func(c echo.Context) bool { return c.Path() == "/healthz" }))
	var seen string
	e.POST("/things/:id", func(c echo.Context) error {
		seen = tracing.Traceparent(c.Request().Context())
		return echo.NewHTTPError(http.StatusServiceUnavailable, "down")
	})
	e.GET("/healthz", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	srv := httptest.NewServer(e)
	defer srv.Close()

	client := &http.Client{Transport: tracing.Transport(nil)}
	ctx := tracing.ContextWithTraceparent(context.Background(), traceparent)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/things/7", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 from the error handler", resp.StatusCode)
	}
	if req.Header.Get("traceparent") != "" {
		t.Fatal("the transport changed the caller's request")
	}
	health, err := client.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()

	byKind := map[trace.SpanKind][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byKind[s.SpanKind()] = append(byKind[s.SpanKind()], s)
	}
	if len(byKind[trace.SpanKindClient]) != 2 || len(byKind[trace.SpanKindServer]) != 1 {
		t.Fatalf("%d client and %d server spans, want 2 and 1 (/healthz is skipped)",
			len(byKind[trace.SpanKindClient]), len(byKind[trace.SpanKindServer]))
	}
	client1, server := byKind[trace.SpanKindClient][0], byKind[trace.SpanKindServer][0]
	if client1.SpanContext().TraceID().String() != traceID || client1.Parent().SpanID().String() != spanID {
		t.Fatalf("client span is not the caller's child: %v under %v", client1.SpanContext(), client1.Parent())
	}
	if server.SpanContext().TraceID().String() != traceID || server.Parent().SpanID() != client1.SpanContext().SpanID() {
		t.Fatalf("server span is not the client span's child: %v under %v", server.SpanContext(), server.Parent())
	}
	if server.Name() != "POST /things/:id" || server.Status().Code != codes.Error {
		t.Fatalf("server span %q status %v, want POST /things/:id with an error status", server.Name(), server.Status())
	}
	if want := "00-" + traceID + "-" + server.SpanContext().SpanID().String() + "-01"; seen != want {
		t.Fatalf("the handler saw %q, want the server span %q", seen, want)
	}
}

func TestSetupRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]tracing.Config{
		"exporter": {Exporter: "jaeger"},
		"endpoint": {Exporter: "otlp", Endpoint: "localhost:4318"},
		"sampler":  {Exporter: "none", Sampler: "sometimes"},
		"ratio":    {Exporter: "none", Sampler: "traceidratio", SamplerArg: 1.5},
	} {
		if _, err := tracing.Setup(context.Background(), cfg, "test"); err == nil {
			t.Errorf("%s: Setup accepted %+v", name, cfg)
		}
	}
}

// With the otlp exporter, Setup's provider sends spans to the collector
// under the service's name, and Shutdown flushes what is still buffered.
func TestSetupExportsOverOTLP(t *testing.T) {
	collector := testinfra.NewOTLPReceiver(t)
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{
		Exporter: "otlp", Endpoint: collector.URL + "/", Sampler: "parentbased_always_on", SamplerArg: 1,
	}, "unit-test")
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(tracing.ContextWithTraceparent(context.Background(), traceparent), "exported",
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
	if s.Service != "unit-test" || s.Name != "exported" || s.TraceID != traceID || s.ParentSpanID != spanID ||
		s.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Fatalf("collector got %+v", s)
	}
}

// Setup with the none exporter leaves the provider alone.
func TestSetupNoneInstallsNoProvider(t *testing.T) {
	rec := recordSpans(t)
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Exporter: "none"}, "test")
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
