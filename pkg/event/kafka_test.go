package event_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
)

func sample() event.Envelope {
	return event.Envelope{
		EventID:          uuid.MustParse("0f8fad5b-d9cb-469f-a165-70867728950e"),
		EventType:        "OrderPlaced",
		EventVersion:     1,
		AggregateType:    "order",
		AggregateID:      "7c9e6679-7425-40de-944b-e07fc1f90ae7",
		AggregateVersion: 3,
		OccurredAt:       time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC),
		CorrelationID:    "req-1",
		Traceparent:      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Payload:          []byte(`{"orderId":"x"}`),
	}
}

func TestKafkaRoundTrip(t *testing.T) {
	in := sample()
	m := event.ToKafka("orders.events", in)
	if string(m.Key) != in.AggregateID {
		t.Fatalf("key = %q, want the aggregate id %q", m.Key, in.AggregateID)
	}
	out, err := event.FromKafka(m)
	if err != nil {
		t.Fatalf("FromKafka: %v", err)
	}
	if !out.OccurredAt.Equal(in.OccurredAt) {
		t.Fatalf("occurred at = %v, want %v", out.OccurredAt, in.OccurredAt)
	}
	out.OccurredAt = in.OccurredAt
	if string(out.Payload) != string(in.Payload) {
		t.Fatalf("payload = %s, want %s", out.Payload, in.Payload)
	}
	out.Payload, in.Payload = nil, nil
	if out.EventID != in.EventID || out.EventType != in.EventType || out.EventVersion != in.EventVersion ||
		out.AggregateType != in.AggregateType || out.AggregateID != in.AggregateID ||
		out.AggregateVersion != in.AggregateVersion || out.CorrelationID != in.CorrelationID ||
		out.CausationID != in.CausationID || out.Traceparent != in.Traceparent {
		t.Fatalf("round trip changed the envelope:\n got %+v\nwant %+v", out, in)
	}
	for _, h := range m.Headers {
		if h.Key == event.HeaderCausationID {
			t.Fatalf("empty causation id travelled as a header")
		}
	}
}

func TestFromKafkaRejects(t *testing.T) {
	without := func(name string) func(*kafka.Message) {
		return func(m *kafka.Message) {
			hs := m.Headers[:0]
			for _, h := range m.Headers {
				if h.Key != name {
					hs = append(hs, h)
				}
			}
			m.Headers = hs
		}
	}
	set := func(name, value string) func(*kafka.Message) {
		return func(m *kafka.Message) {
			for i := range m.Headers {
				if m.Headers[i].Key == name {
					m.Headers[i].Value = []byte(value)
				}
			}
		}
	}
	tests := []struct {
		name   string
		mutate func(*kafka.Message)
		want   string
	}{
		{"no event id", without(event.HeaderEventID), "event-id"},
		{"bad event id", set(event.HeaderEventID, "nope"), "event-id"},
		{"no event type", without(event.HeaderEventType), "event type"},
		{"bad event version", set(event.HeaderEventVersion, "v1"), "event-version"},
		{"zero event version", set(event.HeaderEventVersion, "0"), "event version"},
		{"bad aggregate version", set(event.HeaderAggregateVersion, "x"), "aggregate-version"},
		{"bad occurred at", set(event.HeaderOccurredAt, "yesterday"), "occurred-at"},
		{"key differs", func(m *kafka.Message) { m.Key = []byte("other") }, "differs"},
		{"payload not json", func(m *kafka.Message) { m.Value = []byte("{not json") }, "payload"},
		{"payload not object", func(m *kafka.Message) { m.Value = []byte(`[1]`) }, "payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := event.ToKafka("t", sample())
			tt.mutate(&m)
			_, err := event.FromKafka(m)
			if !errors.Is(err, event.ErrInvalid) {
				t.Fatalf("err = %v, want one wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestDecodePayload(t *testing.T) {
	type orderPlaced struct {
		OrderID string `json:"orderId"`
	}
	e := sample()
	e.Payload = []byte(`{"orderId":"x","addedLater":1}`)
	var p orderPlaced
	if err := e.DecodePayload(&p); err != nil || p.OrderID != "x" {
		t.Fatalf("an additive field must not break consumers: p=%+v err=%v", p, err)
	}
	e.Payload = []byte(`{"orderId":5}`)
	if err := e.DecodePayload(&p); !errors.Is(err, event.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid for a field of the wrong type", err)
	}
}

func TestNewIDsSortInCreationOrder(t *testing.T) {
	prev := event.NewID()
	for range 1000 {
		id := event.NewID()
		if id.Version() != 7 {
			t.Fatalf("NewID returned a version %d UUID, want 7", id.Version())
		}
		if bytes.Compare(id[:], prev[:]) <= 0 {
			t.Fatalf("id %s does not sort after the one created before it, %s", id, prev)
		}
		prev = id
	}
}
