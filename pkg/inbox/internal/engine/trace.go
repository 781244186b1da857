package engine

import (
	"context"
	"strconv"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
)

// tracerScope names the consumer's spans (the instrumentation scope).
const tracerScope = "github.com/onceflow/onceflow/pkg/inbox"

// StartProcess starts the consumer span of one message: a child of the
// trace context in its traceparent header (the producer's span), so the
// trace goes on from the service that published the event. The handler's
// ctx carries the span: events it enqueues store its traceparent, and calls
// it makes continue the trace. Spans come from the process-wide tracer
// provider (tracing.Setup); without one they are no-ops that pass the
// header's context on unchanged.
func (s *Shared) StartProcess(ctx context.Context, m kafka.Message, ev event.Envelope) (context.Context, trace.Span) {
	return otel.GetTracerProvider().Tracer(tracerScope).Start(event.ContextWithTraceparent(ctx, ev.Traceparent),
		"process "+m.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			semconv.MessagingSystemKafka, semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(m.Topic),
			semconv.MessagingConsumerGroupName(s.Config.Name), semconv.MessagingMessageID(ev.EventID.String()),
			semconv.MessagingKafkaMessageKey(string(m.Key)), semconv.MessagingKafkaOffset(int(m.Offset)),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(m.Partition)),
			attribute.String("onceflow.event_type", ev.EventType)))
}
