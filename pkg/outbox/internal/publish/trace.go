package publish

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

// StartSends starts a producer span per Claimed row, each a child of the
// trace context the row was enqueued with (its stored traceparent, such as
// the HTTP request's), and puts that span's own traceparent in the message's
// header: the consumer's span then continues the producer's, and the trace
// runs request -> send -> process. The returned function ends the spans with
// each row's publish error. Spans come from the process-wide tracer
// provider (tracing.Setup); without one they are no-ops that pass the stored
// traceparent on unchanged, and cost little: the attributes are made only
// for a span that records (samplers decide without them), and the header
// is rewritten only when the span is a new one. The message's headers are
// replaced, never written to (setHeader), so a retry starts from the stored
// ones.
func StartSends(ctx context.Context, batch []Claimed) (end func(errs []error)) {
	tracer := otel.GetTracerProvider().Tracer(tracerScope)
	spans := make([]trace.Span, len(batch))
	var name, nameTopic string
	for i := range batch {
		m := &batch[i].Msg
		if name == "" || m.Topic != nameTopic {
			name, nameTopic = "send "+m.Topic, m.Topic
		}
		parent := event.ContextWithTraceparent(ctx, Header(*m, event.HeaderTraceparent))
		sendCtx, span := tracer.Start(parent, name, producerSpan)
		if span.IsRecording() {
			span.SetAttributes(semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend,
				semconv.MessagingOperationName("send"), semconv.MessagingDestinationName(m.Topic),
				semconv.MessagingMessageID(Header(*m, event.HeaderEventID)), semconv.MessagingKafkaMessageKey(string(m.Key)))
		}
		if sc := span.SpanContext(); sc.IsValid() && !sc.Equal(trace.SpanContextFromContext(parent)) {
			if tp := event.TraceparentFromContext(sendCtx); tp != "" {
				SetHeader(m, event.HeaderTraceparent, tp)
			}
		}
		spans[i] = span
	}
	return func(errs []error) {
		for i, span := range spans {
			tracectx.End(span, errs[i])
		}
	}
}

var producerSpan = trace.WithSpanKind(trace.SpanKindProducer)

// Header is m's header key, "" if it has none.
func Header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// SetHeader replaces or adds a header in a copy of m's headers: the slice
// may be shared (the log-based relay's lanes keep the stored headers for a
// retry, and cut them from blocks shared by many events).
func SetHeader(m *kafka.Message, key, value string) {
	h := make([]kafka.Header, 0, len(m.Headers)+1)
	set := false
	for _, x := range m.Headers {
		if x.Key == key {
			x.Value, set = []byte(value), true
		}
		h = append(h, x)
	}
	if !set {
		h = append(h, kafka.Header{Key: key, Value: []byte(value)})
	}
	m.Headers = h
}
