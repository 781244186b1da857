// Package publish takes both relays' rows to Kafka: package outbox's
// polling relay hands it Claimed batches, package outbox/cdc's log-based
// relay its lanes' events. It keeps each aggregate's events in order,
// charges a refusal to the message it is about, and starts the producer
// spans.
package publish

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
)

// ErrUndecodable is the reason recorded on a row the relay cannot make into
// a Kafka message (its headers column does not decode). Like any message
// error it is charged an attempt each try, and goes dead after MaxAttempts
// with this as its last error ("outbox: undecodable row").
var ErrUndecodable = errors.New("outbox: undecodable row")

// Writer is outbox.Writer, documented there.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Claimed is one row (or, in the log-based relay, one decoded event) on its
// way to Kafka.
type Claimed struct {
	ID        int64
	Attempts  int
	CreatedAt time.Time
	AggType   string
	Aggregate string // type + id
	Msg       kafka.Message
	// Undecodable is why the row could not be made into a message; such a
	// row is a message error, charged an attempt and never published.
	Undecodable error
}

// Send is what both relays do with a batch: Batch within timeout, each
// message in its span (StartSends). It returns one error per row.
func Send(ctx context.Context, w Writer, timeout time.Duration, batch []Claimed) []error {
	end := StartSends(ctx, batch)
	sendCtx, cancel := context.WithTimeout(ctx, timeout)
	errs := Batch(sendCtx, w, batch)
	cancel()
	end(errs)
	return errs
}

// Batch writes the batch to w and returns one error per row (nil: acked).
// Each topic is written separately and concurrently: kafka-go fails a whole
// write when one of its topics is unknown, and one misrouted aggregate type
// must not hold up the others. An aggregate's events all go to one topic,
// so writeTopic alone keeps them in order.
func Batch(ctx context.Context, w Writer, batch []Claimed) []error {
	byTopic := map[string][]int{}
	for i, c := range batch {
		byTopic[c.Msg.Topic] = append(byTopic[c.Msg.Topic], i)
	}
	limits := writerLimits(w)
	errs := make([]error, len(batch))
	write := func(idx []int) {
		msgs := make([]kafka.Message, len(idx))
		aggs := make([]string, len(idx))
		for j, i := range idx {
			msgs[j], aggs[j] = batch[i].Msg, batch[i].Aggregate
		}
		for j, err := range writeTopic(ctx, w, limits, msgs, aggs) {
			errs[idx[j]] = err
		}
	}
	if len(byTopic) == 1 { // the log-based relay's lanes: no goroutine to wait for
		for _, idx := range byTopic {
			write(idx)
		}
		return errs
	}
	var wg sync.WaitGroup
	for _, idx := range byTopic {
		wg.Go(func() { write(idx) })
	}
	wg.Wait()
	return errs
}

// ErrHeldBack is the outcome of a message that was not written because an
// earlier message of its aggregate in the same batch failed: the broker must
// not have an aggregate's event while it lacks an earlier one.
var ErrHeldBack = errors.New("outbox: not written: an earlier event of its aggregate in the batch failed")

// batchLimits are how many messages, and how many bytes of them, kafka-go's
// writer puts into one record batch of a partition (Writer.BatchSize and
// BatchBytes). Zero: unknown.
type batchLimits struct {
	count int
	bytes int64
}

// writerLimits reads w's batch limits when w is kafka-go's writer (as
// a wrapper's KafkaWriter() returns); another Writer gets the zero limits, and the
// relay gives it each topic's messages in one call, as it is.
func writerLimits(w Writer) batchLimits {
	var kw *kafka.Writer
	switch w := w.(type) {
	case *kafka.Writer:
		kw = w
	case interface{ KafkaWriter() *kafka.Writer }:
		// A wrapper that owns more than the writer (platform/kafkautil's
		// closes its transport too) hands over the writer it wraps.
		kw = w.KafkaWriter()
	}
	if kw == nil {
		return batchLimits{}
	}
	// kafka-go's own defaults for zero fields.
	l := batchLimits{count: kw.BatchSize, bytes: kw.BatchBytes}
	if l.count <= 0 {
		l.count = 100
	}
	if l.bytes <= 0 {
		l.bytes = 1 << 20
	}
	return l
}

// messageBytes is at least what kafka-go counts for m against BatchBytes
// (its Message.totalSize: the lengths plus fixed fields and varints, which
// 64 bytes and 20 per header more than cover). Overcounting only splits a
// write earlier than needed; undercounting could let kafka-go split one
// partition's messages into two record batches (see writeTopic).
func messageBytes(m kafka.Message) int64 {
	n := int64(64 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(20 + len(h.Key) + len(h.Value))
	}
	return n
}

// writeTopic writes msgs, in order, to one topic and returns one error per
// message; aggs[i] names msgs[i]'s aggregate. Two rules shape it.
//
// An aggregate's later messages are never written once one of its messages
// failed: they get ErrHeldBack and stay behind it (relayBatch leaves them
// pending). The broker judges a partition's record batch as a whole, but
// kafka-go cuts one call's messages for a partition into several record
// batches when they exceed its BatchSize or BatchBytes and sends them one
// after the other, so in one call the broker could refuse v1 and then take
// v2. writeTopic therefore cuts msgs into calls that each fit one record
// batch per partition (limits), and holds an aggregate back in the calls
// after the one where it failed. Within a call, an aggregate's messages
// share one partition and one record batch, and so their fate.
//
// A message error lands on the message it is about, not on its batch-mates,
// which would otherwise be charged an attempt for it (writeCall).
func writeTopic(ctx context.Context, w Writer, limits batchLimits, msgs []kafka.Message, aggs []string) []error {
	errs := make([]error, len(msgs))
	failed := map[string]bool{}
	for _, a := range aggs {
		failed[a] = false
	}
	if len(failed) == len(msgs) {
		// No aggregate has two events here, so no split can reorder one:
		// one call, however kafka-go cuts it, is the fastest.
		limits = batchLimits{}
	}
	for start := 0; start < len(msgs); {
		end, bytes := start, int64(0)
		for end < len(msgs) {
			n := messageBytes(msgs[end])
			if end > start && limits.count > 0 && (end-start >= limits.count || bytes+n > limits.bytes) {
				break
			}
			bytes += n
			end++
		}
		var todo []int // indexes into msgs to write in this call
		for i := start; i < end; i++ {
			if failed[aggs[i]] {
				errs[i] = ErrHeldBack
				continue
			}
			todo = append(todo, i)
		}
		writeCall(ctx, w, msgs, aggs, todo, errs)
		for _, i := range todo {
			if errs[i] != nil {
				failed[aggs[i]] = true
			}
		}
		start = end
	}
	return errs
}

// writeCall writes msgs[todo] in one call and records each one's outcome in
// errs:
//   - kafka-go refuses the whole write, before sending anything, when one
//     message is larger than its BatchBytes (kafka.MessageTooLargeError,
//     naming the message): that message gets the error, the later messages
//     of its aggregate are held back, and the rest are written again;
//   - the broker judges a whole record batch at once, so a message error
//     it returns for several messages is checked by writing each of them
//     on its own, in order, holding back an aggregate's later messages
//     once one of its messages fails.
func writeCall(ctx context.Context, w Writer, msgs []kafka.Message, aggs []string, todo []int, errs []error) {
	for len(todo) > 0 {
		batch := make([]kafka.Message, len(todo))
		for j, i := range todo {
			batch[j] = msgs[i]
		}
		err := w.WriteMessages(ctx, batch...)
		var tooLarge kafka.MessageTooLargeError
		if errors.As(err, &tooLarge) {
			if j := slices.IndexFunc(batch, func(m kafka.Message) bool { return SameMessage(m, tooLarge.Message) }); j >= 0 {
				refused := todo[j]
				errs[refused] = err
				rest := todo[:j:j]
				for _, i := range todo[j+1:] {
					if aggs[i] == aggs[refused] {
						errs[i] = ErrHeldBack
						continue
					}
					rest = append(rest, i)
				}
				todo = rest
				continue
			}
		}
		judged := map[int]bool{}
		for j, e := range perMessage(err, len(todo)) {
			errs[todo[j]] = e
			if kafkaerr.IsMessageError(e) {
				judged[todo[j]] = true
			}
		}
		if len(judged) > 1 {
			bad := map[string]bool{}
			for _, i := range todo {
				switch {
				case errs[i] == nil:
					// Written by the call above.
				case bad[aggs[i]]:
					errs[i] = ErrHeldBack
				case judged[i]:
					errs[i] = perMessage(w.WriteMessages(ctx, msgs[i]), 1)[0]
				}
				if errs[i] != nil {
					bad[aggs[i]] = true
				}
			}
		}
		return
	}
}

// SameMessage tells a message by its key, value and headers; the headers
// carry the event id, so two events never compare equal.
func SameMessage(a, b kafka.Message) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) &&
		slices.EqualFunc(a.Headers, b.Headers, func(x, y kafka.Header) bool {
			return x.Key == y.Key && bytes.Equal(x.Value, y.Value)
		})
}

// perMessage spreads a write error over the messages: kafka-go reports
// either one error per message (kafka.WriteErrors) or one for the write.
func perMessage(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) && len(we) == n {
		return we
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// Headers is the JSON shape of the outbox table's headers column, the
// envelope's fields that become Kafka headers besides the ones the row has
// columns for.
type Headers struct {
	CorrelationID string `json:"correlationId,omitempty"`
	CausationID   string `json:"causationId,omitempty"`
	Traceparent   string `json:"traceparent,omitempty"`
}

// DefaultTopic is both relays' default Topic: aggregateType + ".events".
func DefaultTopic(aggregateType string) string { return aggregateType + ".events" }

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
