package event

import (
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
)

// Kafka header names carrying the envelope fields.
const (
	HeaderEventID          = "event-id"
	HeaderEventType        = "event-type"
	HeaderEventVersion     = "event-version"
	HeaderAggregateType    = "aggregate-type"
	HeaderAggregateID      = "aggregate-id"
	HeaderAggregateVersion = "aggregate-version"
	HeaderOccurredAt       = "occurred-at"
	HeaderCorrelationID    = "correlation-id"
	HeaderCausationID      = "causation-id"
	HeaderTraceparent      = "traceparent"
)

// ToKafka builds the Kafka message for e on topic: key, payload, the
// envelope's headers and the CloudEvents headers (AppendCloudEvents). It does
// not validate e.
func ToKafka(topic string, e Envelope) kafka.Message {
	id, typ, aggID := []byte(e.EventID.String()), []byte(e.EventType), []byte(e.AggregateID)
	occurredAt := []byte(e.OccurredAt.UTC().Format(time.RFC3339Nano))
	h := make([]kafka.Header, 0, 10+CloudEventsHeaders)
	h = append(h,
		kafka.Header{Key: HeaderEventID, Value: id},
		kafka.Header{Key: HeaderEventType, Value: typ},
		kafka.Header{Key: HeaderEventVersion, Value: []byte(strconv.Itoa(e.EventVersion))},
		kafka.Header{Key: HeaderAggregateType, Value: []byte(e.AggregateType)},
		kafka.Header{Key: HeaderAggregateID, Value: aggID},
		kafka.Header{Key: HeaderAggregateVersion, Value: []byte(strconv.FormatInt(e.AggregateVersion, 10))},
		kafka.Header{Key: HeaderOccurredAt, Value: occurredAt},
	)
	// Optional fields travel only when set, so consumers can tell "absent" from "empty".
	for _, kv := range [...]struct{ k, v string }{
		{HeaderCorrelationID, e.CorrelationID},
		{HeaderCausationID, e.CausationID},
		{HeaderTraceparent, e.Traceparent},
	} {
		if kv.v != "" {
			h = append(h, kafka.Header{Key: kv.k, Value: []byte(kv.v)})
		}
	}
	h = AppendCloudEvents(h, []byte(CloudEventsSource(e.AggregateType)), id, typ, aggID, occurredAt)
	return kafka.Message{
		Topic:   topic,
		Key:     []byte(e.AggregateID),
		Value:   e.Payload,
		Headers: h,
	}
}

// FromKafka decodes and validates the envelope of m. Every error wraps
// ErrInvalid: a message that cannot be decoded now never will be.
func FromKafka(m kafka.Message) (Envelope, error) {
	h := make(map[string]string, len(m.Headers))
	for _, kv := range m.Headers {
		h[kv.Key] = string(kv.Value)
	}
	var e Envelope
	var err error
	if e.EventID, err = uuid.Parse(h[HeaderEventID]); err != nil {
		return Envelope{}, fmt.Errorf("%w: header %s: %v", ErrInvalid, HeaderEventID, err)
	}
	if e.EventVersion, err = strconv.Atoi(h[HeaderEventVersion]); err != nil {
		return Envelope{}, fmt.Errorf("%w: header %s: %v", ErrInvalid, HeaderEventVersion, err)
	}
	if e.AggregateVersion, err = strconv.ParseInt(h[HeaderAggregateVersion], 10, 64); err != nil {
		return Envelope{}, fmt.Errorf("%w: header %s: %v", ErrInvalid, HeaderAggregateVersion, err)
	}
	if e.OccurredAt, err = time.Parse(time.RFC3339Nano, h[HeaderOccurredAt]); err != nil {
		return Envelope{}, fmt.Errorf("%w: header %s: %v", ErrInvalid, HeaderOccurredAt, err)
	}
	e.EventType = h[HeaderEventType]
	e.AggregateType = h[HeaderAggregateType]
	e.AggregateID = h[HeaderAggregateID]
	e.CorrelationID = h[HeaderCorrelationID]
	e.CausationID = h[HeaderCausationID]
	e.Traceparent = h[HeaderTraceparent]
	e.Payload = m.Value
	if e.AggregateID != string(m.Key) {
		return Envelope{}, fmt.Errorf("%w: key %q differs from header %s %q", ErrInvalid, m.Key, HeaderAggregateID, e.AggregateID)
	}
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}
