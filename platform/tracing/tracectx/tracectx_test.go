package tracectx_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/platform/tracing/tracectx"
)

const (
	traceID     = testinfra.CallerTraceID
	spanID      = testinfra.CallerSpanID
	traceparent = testinfra.CallerTraceparent
)

func TestTraceparentRoundTrip(t *testing.T) {
	ctx := tracectx.WithTraceparent(context.Background(), traceparent)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != traceID || sc.SpanID().String() != spanID || !sc.IsSampled() {
		t.Fatalf("extracted %+v from %s", sc, traceparent)
	}
	if got := tracectx.Traceparent(ctx); got != traceparent {
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
		ctx := tracectx.WithTraceparent(context.Background(), tp)
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("%q gave a valid span context %v", tp, sc)
		}
		if got := tracectx.Traceparent(ctx); got != "" {
			t.Errorf("%q: Traceparent = %q, want empty", tp, got)
		}
	}
}

// A child span started from the extracted context belongs to the same trace
// and names the traceparent's span as its parent; its own traceparent is what
// the next hop receives.
func TestContinuingATraceparent(t *testing.T) {
	rec := testinfra.RecordSpans(t)
	ctx, span := otel.Tracer("test").Start(tracectx.WithTraceparent(context.Background(), traceparent), "child")
	next := tracectx.Traceparent(ctx)
	tracectx.End(span, errors.New("boom"))

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
	ctx, span := noop.NewTracerProvider().Tracer("test").Start(tracectx.WithTraceparent(context.Background(), traceparent), "x")
	defer span.End()
	if got := tracectx.Traceparent(ctx); got != traceparent {
		t.Fatalf("Traceparent = %q, want the caller's %q", got, traceparent)
	}
}

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
	client := &http.Client{Transport: tracectx.Transport(nil)}
	req, _ := http.NewRequestWithContext(tracectx.WithTraceparent(context.Background(), traceparent), http.MethodGet, srv.URL, nil)
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
