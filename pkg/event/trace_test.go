package event_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
	"github.com/onceflow/onceflow/pkg/testenv"
)

const (
	traceID     = testenv.CallerTraceID
	spanID      = testenv.CallerSpanID
	traceparent = testenv.CallerTraceparent
)

func TestTraceparentRoundTrip(t *testing.T) {
	ctx := event.ContextWithTraceparent(context.Background(), traceparent)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != traceID || sc.SpanID().String() != spanID || !sc.IsSampled() {
		t.Fatalf("extracted %+v from %s", sc, traceparent)
	}
	if got := event.TraceparentFromContext(ctx); got != traceparent {
		t.Fatalf("TraceparentFromContext = %q, want %q", got, traceparent)
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
		ctx := event.ContextWithTraceparent(context.Background(), tp)
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("%q gave a valid span context %v", tp, sc)
		}
		if got := event.TraceparentFromContext(ctx); got != "" {
			t.Errorf("%q: TraceparentFromContext = %q, want empty", tp, got)
		}
	}
}

// A child span started from the extracted context belongs to the same trace
// and names the traceparent's span as its parent; its own traceparent is what
// the next hop receives; tracectx.End marks it failed.
func TestContinuingATraceparent(t *testing.T) {
	rec := testenv.RecordSpans(t)
	ctx, span := otel.Tracer("test").Start(event.ContextWithTraceparent(context.Background(), traceparent), "child")
	next := event.TraceparentFromContext(ctx)
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
	ctx, span := noop.NewTracerProvider().Tracer("test").Start(event.ContextWithTraceparent(context.Background(), traceparent), "x")
	defer span.End()
	if got := event.TraceparentFromContext(ctx); got != traceparent {
		t.Fatalf("TraceparentFromContext = %q, want the caller's %q", got, traceparent)
	}
}
