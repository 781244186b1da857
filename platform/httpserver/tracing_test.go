package httpserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/httpserver"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/platform/tracing"
)

// The server middleware continues the caller's trace and hands its span to
// the handler; the client transport sends its own span's context, so a call
// through both makes a parent chain client -> server.
func TestMiddlewareAndTransport(t *testing.T) {
	rec := testinfra.RecordSpans(t)
	e := echo.New()
	e.Use(httpserver.TracingMiddleware(func(c echo.Context) bool { return c.Path() == "/healthz" }))
	var seen string
	e.POST("/things/:id", func(c echo.Context) error {
		seen = event.TraceparentFromContext(c.Request().Context())
		return echo.NewHTTPError(http.StatusServiceUnavailable, "down")
	})
	e.GET("/healthz", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	srv := httptest.NewServer(e)
	defer srv.Close()

	client := &http.Client{Transport: tracing.Transport(nil)}
	ctx := event.ContextWithTraceparent(context.Background(), testinfra.CallerTraceparent)
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
	if client1.SpanContext().TraceID().String() != testinfra.CallerTraceID || client1.Parent().SpanID().String() != testinfra.CallerSpanID {
		t.Fatalf("client span is not the caller's child: %v under %v", client1.SpanContext(), client1.Parent())
	}
	if server.SpanContext().TraceID().String() != testinfra.CallerTraceID || server.Parent().SpanID() != client1.SpanContext().SpanID() {
		t.Fatalf("server span is not the client span's child: %v under %v", server.SpanContext(), server.Parent())
	}
	if server.Name() != "POST /things/:id" || server.Status().Code != codes.Error {
		t.Fatalf("server span %q status %v, want POST /things/:id with an error status", server.Name(), server.Status())
	}
	if want := "00-" + testinfra.CallerTraceID + "-" + server.SpanContext().SpanID().String() + "-01"; seen != want {
		t.Fatalf("the handler saw %q, want the server span %q", seen, want)
	}
}
