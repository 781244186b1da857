package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The relay publishes each event in a producer span that continues the
// trace context stored with the row, and the Kafka message carries the
// producer span's traceparent, so a consumer continues the producer. An
// event stored without a traceparent starts a trace of its own.
func TestRelayContinuesTheStoredTraceInAProducerSpan(t *testing.T) {
	rec := testenv.RecordSpans(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 1)
	pool := newOutboxDB(t)

	const traceID, spanID = testenv.CallerTraceID, testenv.CallerSpanID
	traced, untraced := newEvent("a", 1), newEvent("a", 2)
	traced.Traceparent = testenv.CallerTraceparent
	enqueue(t, pool, traced, untraced)

	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{Topic: func(string) string { return topic }})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	if n, err := relay.RelayBatch(ctx); err != nil || n != 2 {
		t.Fatalf("RelayBatch: n=%d err=%v", n, err)
	}

	spans := map[string]trace.SpanContext{}   // event id -> producer span
	parents := map[string]trace.SpanContext{} // event id -> its parent
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindProducer || s.Name() != "send "+topic {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "messaging.message.id" {
				spans[a.Value.AsString()], parents[a.Value.AsString()] = s.SpanContext(), s.Parent()
			}
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d producer spans for the two events, want 2", len(spans))
	}
	if p := parents[traced.EventID.String()]; p.TraceID().String() != traceID || p.SpanID().String() != spanID {
		t.Fatalf("the traced event's producer span has parent %v, want the stored traceparent", p)
	}
	if p, s := parents[untraced.EventID.String()], spans[untraced.EventID.String()]; p.IsValid() || s.TraceID().String() == traceID {
		t.Fatalf("the untraced event's producer span (%v, parent %v) should start a trace of its own", s, p)
	}

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: testenv.Name("g"), MaxWait: 100 * time.Millisecond})
	defer r.Close()
	for range 2 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := event.FromKafka(m)
		if err != nil {
			t.Fatal(err)
		}
		s := spans[ev.EventID.String()]
		if want := "00-" + s.TraceID().String() + "-" + s.SpanID().String() + "-01"; ev.Traceparent != want {
			t.Fatalf("event %s arrived with traceparent %q, want its producer span's %q", ev.EventID, ev.Traceparent, want)
		}
	}
	// The row keeps what the producer stored: a replay continues the original trace.
	var stored string
	if err := pool.QueryRow(ctx, `SELECT headers->>'traceparent' FROM outbox_events WHERE event_id = $1`, traced.EventID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != traced.Traceparent {
		t.Fatalf("the outbox row's traceparent became %q, want %q", stored, traced.Traceparent)
	}
}
