package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/platform/tracing"
)

const (
	traceID     = testinfra.CallerTraceID
	spanID      = testinfra.CallerSpanID
	traceparent = testinfra.CallerTraceparent
)

// The transport sends its client span's context, not the caller's, and
// leaves the caller's request unchanged.
func TestTransportSendsItsSpansContext(t *testing.T) {
	rec := testinfra.RecordSpans(t)
	received := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received <- r.Header.Get("traceparent")
		w.WriteHeader(http.StatusConflict)
	}))
	defer srv.Close()
	client := &http.Client{Transport: tracing.Transport(nil)}
	req, _ := http.NewRequestWithContext(event.ContextWithTraceparent(context.Background(), traceparent), http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.Header.Get("traceparent") != "" {
		t.Fatal("the transport changed the caller's request")
	}
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans, want 1", len(ended))
	}
	s := ended[0]
	if s.SpanKind() != trace.SpanKindClient || s.Parent().SpanID().String() != spanID || s.Status().Code != codes.Error {
		t.Fatalf("client span: kind %v, parent %v, status %v", s.SpanKind(), s.Parent().SpanID(), s.Status())
	}
	if got, want := <-received, "00-"+traceID+"-"+s.SpanContext().SpanID().String()+"-01"; got != want {
		t.Fatalf("server received traceparent %q, want the client span's %q", got, want)
	}
}
