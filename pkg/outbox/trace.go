package outbox

import (
	"context"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
)

// tracerScope names the relay's spans (the instrumentation scope).
const tracerScope = "github.com/onceflow/onceflow/pkg/outbox"

// startSends starts a producer span per claimed row, each a child of the
// trace context the row was enqueued with (its stored traceparent, such as
// the HTTP request's), and puts that span's own traceparent in the message's
// header: the consumer's span then continues the producer's, and the trace
// runs request -> send -> process. The returned function ends the spans with
// each row's publish error. Spans come from the process-wide tracer
// provider (tracing.Setup); without one they are no-ops that pass the stored
// traceparent on unchanged.
func startSends(ctx context.Context, batch []claimed) (end func(errs []error)) {
	tracer := otel.GetTracerProvider().Tracer(tracerScope)
	spans := make([]trace.Span, len(batch))
	for i := range batch {
		m := &batch[i].msg
		parent := event.ContextWithTraceparent(ctx, header(*m, event.HeaderTraceparent))
		sendCtx, span := tracer.Start(parent, "send "+m.Topic, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend,
				semconv.MessagingOperationName("send"), semconv.MessagingDestinationName(m.Topic),
				semconv.MessagingMessageID(header(*m, event.HeaderEventID)), semconv.MessagingKafkaMessageKey(string(m.Key))))
		if tp := event.TraceparentFromContext(sendCtx); tp != "" {
			setHeader(m, event.HeaderTraceparent, tp)
		}
		spans[i] = span
	}
	return func(errs []error) {
		for i, span := range spans {
			tracectx.End(span, errs[i])
		}
	}
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// setHeader replaces or adds a header; event.ToKafka built the slice for this
// message alone, so it is changed in place.
func setHeader(m *kafka.Message, key, value string) {
	for i, h := range m.Headers {
		if h.Key == key {
			m.Headers[i].Value = []byte(value)
			return
		}
	}
	m.Headers = append(m.Headers, kafka.Header{Key: key, Value: []byte(value)})
}
