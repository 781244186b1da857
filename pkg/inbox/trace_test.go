package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The producer's context, as the message's traceparent header carries it.
const (
	producerTraceID = testenv.CallerTraceID
	producerSpanID  = testenv.CallerSpanID
)

// tracedEvent is an event whose Kafka header carries a producer's context.
func tracedEvent() event.Envelope {
	ev := newEvent("agg", 1)
	ev.Traceparent = testenv.CallerTraceparent
	return ev
}

// startTraced starts a trace test: spans recorded, a fixture, a traced
// event produced to its topic, and a runUnder for the handler to record
// what it ran under.
func startTraced(t *testing.T) (*tracetest.SpanRecorder, *fixture, event.Envelope, *runUnder) {
	t.Helper()
	rec := testenv.RecordSpans(t)
	f := newFixture(t)
	ev := tracedEvent()
	f.produce(t, event.ToKafka(f.topic, ev))
	return rec, f, ev, &runUnder{}
}

// runUnder records the traceparent each event's handler or side effect ran under.
type runUnder struct {
	mu sync.Mutex
	m  map[string]string
}

func (r *runUnder) add(ctx context.Context, ev event.Envelope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]string{}
	}
	r.m[ev.EventID.String()] = event.TraceparentFromContext(ctx)
}

func (r *runUnder) of(ev event.Envelope) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tp, ok := r.m[ev.EventID.String()]
	return tp, ok
}

// wait waits up to 30 seconds for ev to have run and for done, named what,
// and returns the traceparent ev ran under.
func (r *runUnder) wait(t *testing.T, ev event.Envelope, what string, done func() bool) string {
	t.Helper()
	var saw string
	testenv.WaitFor(t, 30*time.Second, what, func() (bool, error) {
		var ok bool
		saw, ok = r.of(ev)
		return ok && done(), nil
	})
	return saw
}

// checkOneConsumerSpan waits for a span to end, then checks as
// checkConsumerSpans does and that ev, run once, had one consumer span.
func checkOneConsumerSpan(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the consumer span to end", func() (bool, error) {
		return len(rec.Ended()) > 0, nil
	})
	if spans := checkConsumerSpans(t, rec, topic, ev, handlerSaw); len(spans) != 1 {
		t.Fatalf("%d consumer spans, want 1", len(spans))
	}
}

// checkConsumerSpans checks that every consumer span of ev continues the
// producer's context from the header, that the handler's last run was under
// one of them, and returns them (one per run of the handler).
func checkConsumerSpans(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	sawIt := false
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process "+topic {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key != "messaging.message.id" || a.Value.AsString() != ev.EventID.String() {
				continue
			}
			found = append(found, s)
			if p := s.Parent(); p.TraceID().String() != producerTraceID || p.SpanID().String() != producerSpanID || !p.IsRemote() {
				t.Fatalf("a consumer span's parent is %v, want the producer's span from the header", p)
			}
			sawIt = sawIt || handlerSaw == "00-"+producerTraceID+"-"+s.SpanContext().SpanID().String()+"-01"
		}
	}
	if !sawIt {
		t.Fatalf("the handler ran under %q, not under one of the event's %d consumer spans", handlerSaw, len(found))
	}
	return found
}

func TestTheHandlerRunsInAConsumerSpanContinuingTheProducer(t *testing.T) {
	rec, f, ev, under := startTraced(t)
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		under.add(ctx, ev)
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{})

	saw := under.wait(t, ev, "the event to be handled", func() bool { return f.count(t, "SELECT count(*) FROM effects") == 1 })
	checkOneConsumerSpan(t, rec, f.topic, ev, saw)
}

// A handler that fails once takes the batch off the fast path; each run of
// it has its own consumer span in the producer's trace, the failed one
// marked as an error.
func TestEachRunOfAFailingHandlerHasItsOwnSpan(t *testing.T) {
	rec, f, ev, under := startTraced(t)
	var failed atomic.Bool
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		under.add(ctx, ev)
		if !failed.Swap(true) {
			return errors.New("transient")
		}
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})

	saw := under.wait(t, ev, "the event to be handled", func() bool { return f.count(t, "SELECT count(*) FROM effects") == 1 })
	var spans []sdktrace.ReadOnlySpan
	testenv.WaitFor(t, 10*time.Second, "the consumer spans to end", func() (bool, error) {
		spans = checkConsumerSpans(t, rec, f.topic, ev, saw)
		return len(spans) >= 2, nil
	})
	errored := 0
	for _, s := range spans {
		if s.Status().Code == codes.Error {
			errored++
		}
	}
	if errored != len(spans)-1 {
		t.Fatalf("%d of %d runs' spans are errors, want all but the last", errored, len(spans))
	}
}
