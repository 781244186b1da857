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
	aggregateID := func(id string) func(*kafka.Message) {
		return func(m *kafka.Message) {
			set(event.HeaderAggregateID, id)(m)
			m.Key = []byte(id)
		}
	}
	long := strings.Repeat("x", event.MaxNameBytes+1)
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
		{"payload not utf-8", func(m *kafka.Message) { m.Value = []byte("{\"a\":\"\xff\"}") }, "payload is not valid UTF-8"},
		{"NUL in aggregate id", aggregateID("order\x00-1"), "aggregate id holds a NUL"},
		{"invalid UTF-8 in aggregate id", aggregateID("order-\xc3\x28"), "aggregate id is not valid UTF-8"},
		{"aggregate id too long", aggregateID(long), "aggregate id is 201 bytes"},
		{"NUL in event type", set(event.HeaderEventType, "Order\x00Placed"), "event type holds a NUL"},
		{"invalid UTF-8 in event type", set(event.HeaderEventType, "Order\xffPlaced"), "event type is not valid UTF-8"},
		{"event type too long", set(event.HeaderEventType, long), "event type is 201 bytes"},
		{"NUL in aggregate type", set(event.HeaderAggregateType, "or\x00der"), "aggregate type holds a NUL"},
		{"NUL in correlation id", set(event.HeaderCorrelationID, "req\x00"), "correlation id holds a NUL"},
		{"invalid UTF-8 in traceparent", set(event.HeaderTraceparent, "00-\xfe"), "traceparent is not valid UTF-8"},
		{"traceparent too long", set(event.HeaderTraceparent, strings.Repeat("0", event.MaxTraceparentBytes+1)), "traceparent is 513 bytes"},
		{"absurd event version", set(event.HeaderEventVersion, "10001"), "event version 10001 is above"},
		{"negative event version", set(event.HeaderEventVersion, "-3"), "event version"},
		{"zero aggregate version", set(event.HeaderAggregateVersion, "0"), "aggregate version"},
		{"absurd aggregate version", set(event.HeaderAggregateVersion, "9223372036854775807"), "aggregate version 9223372036854775807 is above"},
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

// The CloudEvents headers repeat the envelope, so a CloudEvents consumer and
// FromKafka read the same event; FromKafka ignores them.
func TestToKafkaAddsTheCloudEventsHeaders(t *testing.T) {
	e := event.Envelope{
		EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order line",
		AggregateID: "o-1", AggregateVersion: 2, OccurredAt: time.Date(2026, 6, 8, 11, 14, 32, 118123000, time.FixedZone("CEST", 2*3600)),
		Payload: []byte(`{}`),
	}
	m := event.ToKafka("t", e)
	got := map[string]string{}
	for _, h := range m.Headers {
		got[h.Key] = string(h.Value)
	}
	for k, want := range map[string]string{
		event.HeaderCESpecVersion: "1.0",
		event.HeaderCEID:          e.EventID.String(),
		event.HeaderCESource:      "/onceflow/order%20line",
		event.HeaderCEType:        "OrderPlaced",
		event.HeaderCESubject:     "o-1",
		event.HeaderCETime:        "2026-06-08T09:14:32.118123Z",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	back, err := event.FromKafka(m)
	if err != nil || back.EventID != e.EventID {
		t.Fatalf("FromKafka = %+v, %v", back, err)
	}
}
