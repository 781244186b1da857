package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/platform/kafkautil"
	"github.com/onceflow/onceflow/pkg/platform/testinfra"
	"github.com/onceflow/onceflow/pkg/platform/tracing/tracectx"
)

// The producer's context, as the message's traceparent header carries it.
const (
	producerTraceID = testinfra.CallerTraceID
	producerSpanID  = testinfra.CallerSpanID
)

// tracedEvent is an event whose Kafka header carries a producer's context.
func tracedEvent() event.Envelope {
	ev := newEvent("agg", 1)
	ev.Traceparent = testinfra.CallerTraceparent
	return ev
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
	r.m[ev.EventID.String()] = tracectx.Traceparent(ctx)
}

func (r *runUnder) of(ev event.Envelope) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tp, ok := r.m[ev.EventID.String()]
	return tp, ok
}

// checkConsumerSpan checks that ev has one consumer span, that it continues
// the producer's context from the header, and that the handler ran under it.
func checkConsumerSpan(t *testing.T, rec *tracetest.SpanRecorder, topic string, ev event.Envelope, handlerSaw string) {
	t.Helper()
	var found []trace.SpanContext
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process "+topic {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "messaging.message.id" && a.Value.AsString() == ev.EventID.String() {
				found = append(found, s.SpanContext())
				if p := s.Parent(); p.TraceID().String() != producerTraceID || p.SpanID().String() != producerSpanID || !p.IsRemote() {
					t.Fatalf("the consumer span's parent is %v, want the producer's span from the header", p)
				}
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d consumer spans for the event, want 1", len(found))
	}
	if want := "00-" + producerTraceID + "-" + found[0].SpanID().String() + "-01"; handlerSaw != want {
		t.Fatalf("the handler ran under %q, want the consumer span %q", handlerSaw, want)
	}
}

func TestTheHandlerRunsInAConsumerSpanContinuingTheProducer(t *testing.T) {
	rec := testinfra.RecordSpans(t)
	f := newFixture(t)
	ev := tracedEvent()
	var under runUnder
	f.produce(t, event.ToKafka(f.topic, ev))
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		under.add(ctx, ev)
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{})

	var saw string
	testinfra.WaitFor(t, 30*time.Second, "the event to be handled", func() (bool, error) {
		var ok bool
		saw, ok = under.of(ev)
		return ok && f.count(t, "SELECT count(*) FROM effects") == 1, nil
	})
	testinfra.WaitFor(t, 10*time.Second, "the consumer span to end", func() (bool, error) {
		return len(rec.Ended()) > 0, nil
	})
	checkConsumerSpan(t, rec, f.topic, ev, saw)
}

func TestALeasedSideEffectRunsInAConsumerSpanContinuingTheProducer(t *testing.T) {
	rec := testinfra.RecordSpans(t)
	f := newFixture(t)
	ev := tracedEvent()
	var under runUnder
	f.produce(t, event.ToKafka(f.topic, ev))
	r := kafkautil.NewGroupReader(f.brokers, f.topic, testinfra.Name("group"))
	c, err := inbox.NewLeaseConsumer(f.pool, r, f.writer, inbox.Effect{
		Check: func(context.Context, string) (bool, error) { return false, nil },
		Call: func(ctx context.Context, ev event.Envelope, _ string) error {
			under.add(ctx, ev)
			return nil
		},
	}, inbox.Config{Name: "lease-test", Metrics: inbox.NewMetrics(f.registry)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, c, r)

	var saw string
	testinfra.WaitFor(t, 30*time.Second, "the side effect to run and be marked done", func() (bool, error) {
		var ok bool
		saw, ok = under.of(ev)
		return ok && f.count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == 1, nil
	})
	testinfra.WaitFor(t, 10*time.Second, "the consumer span to end", func() (bool, error) {
		return len(rec.Ended()) > 0, nil
	})
	checkConsumerSpan(t, rec, f.topic, ev, saw)
}
