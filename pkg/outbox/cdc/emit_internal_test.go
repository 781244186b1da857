package cdc

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
	"github.com/onceflow/onceflow/pkg/outbox/internal/wal"
)

// emitted is a message as Emit has Postgres write it: Emit's header, the
// emitted-at time and the payload.
func emitted(ev event.Envelope, at time.Time) []byte {
	b := binary.BigEndian.AppendUint64(wal.EncodeHeader(ev), uint64(at.UnixMicro()))
	return append(b, ev.Payload...)
}

func validEmitted() event.Envelope {
	return event.Envelope{
		EventID: uuid.MustParse("6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192"), EventType: "PaymentCaptured", EventVersion: 1,
		AggregateType: "payment", AggregateID: "p-1", AggregateVersion: 7,
		OccurredAt:    time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC),
		CorrelationID: "corr", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Payload: []byte(`{"amount": 100}`),
	}
}

// What the log-based relay makes of a message under wal.Prefix: Emit's
// encodings, the binary one it writes and the JSON one it wrote before, are
// accepted; anything else is refused with the reason it is counted under,
// never published.
func TestDecodeEmitted(t *testing.T) {
	const valid = `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
		`"aggregateType":"payment","aggregateId":"p-1","aggregateVersion":1,"occurredAt":"2026-01-02T03:04:05.123456Z",` +
		`"correlationId":"","causationId":"","traceparent":"","payload":{"amount":100},"emittedAt":"2026-01-02T03:04:05.2Z"}`
	at := time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)
	binaryValid := emitted(validEmitted(), at)
	noAggregate := validEmitted()
	noAggregate.AggregateID = " "
	notAnObject := validEmitted()
	notAnObject.Payload = []byte(`[1]`)
	for _, tc := range []struct {
		name, content, reason string
	}{
		{"what Emit writes", string(binaryValid), ""},
		{"what Emit wrote before", valid, ""},
		{"not JSON", `PaymentCaptured 100`, metrics.RefusedUndecodable},
		{"empty", ``, metrics.RefusedUndecodable},
		{"a JSON array", `[1,2]`, metrics.RefusedUndecodable},
		{"a bad event id", `{"eventId":"nope"}`, metrics.RefusedUndecodable},
		{"no event id", `{"eventType":"PaymentCaptured","eventVersion":1,"aggregateType":"payment","aggregateId":"p-1",` +
			`"aggregateVersion":1,"occurredAt":"2026-01-02T03:04:05Z","payload":{}}`, metrics.RefusedInvalid},
		{"no aggregate", `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
			`"occurredAt":"2026-01-02T03:04:05Z","payload":{}}`, metrics.RefusedInvalid},
		{"a bad occurredAt", `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
			`"aggregateType":"payment","aggregateId":"p-1","aggregateVersion":1,"occurredAt":"yesterday","payload":{}}`, metrics.RefusedInvalid},
		{"no payload", `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
			`"aggregateType":"payment","aggregateId":"p-1","aggregateVersion":1,"occurredAt":"2026-01-02T03:04:05Z"}`, metrics.RefusedInvalid},
		{"binary, cut short", string(binaryValid[:30]), metrics.RefusedUndecodable},
		{"binary, a length past the end", string(append(wal.EncodeHeader(validEmitted())[:37], 0xff, 0xff, 0xff, 0xff)), metrics.RefusedUndecodable},
		{"binary, no payload", string(binaryValid[:len(binaryValid)-len(validEmitted().Payload)]), metrics.RefusedInvalid},
		{"binary, a blank aggregate id", string(emitted(noAggregate, at)), metrics.RefusedInvalid},
		{"binary, a payload that is not an object", string(emitted(notAnObject, at)), metrics.RefusedInvalid},
		{"binary, a payload that is not JSON", string(append(binaryValid[:len(binaryValid)-1:len(binaryValid)-1], ',')), metrics.RefusedInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ev rawEnvelope
			_, reason, err := decodeEmitted([]byte(tc.content), &ev)
			if reason != tc.reason || (err == nil) != (tc.reason == "") {
				t.Fatalf("decodeEmitted = reason %q, error %v; want reason %q", reason, err, tc.reason)
			}
			if err == nil {
				if verr := ev.envelope().Validate(); verr != nil {
					t.Errorf("accepted an envelope that does not validate: %v", verr)
				}
			}
		})
	}
}

// The binary encoding carries every field of the envelope, the occurred-at
// time to the microsecond (as the outbox table stores it), and the time
// Postgres emitted the event.
func TestEmitBinaryRoundTrip(t *testing.T) {
	want := validEmitted()
	want.CausationID = "cause"
	at := time.Date(2026, 1, 2, 3, 4, 6, 789000, time.UTC)
	var ev rawEnvelope
	emittedAt, reason, err := decodeEmitted(emitted(want, at), &ev)
	if err != nil {
		t.Fatalf("decodeEmitted: %v (%s)", err, reason)
	}
	if !emittedAt.Equal(at) {
		t.Errorf("emitted at %v, want %v", emittedAt, at)
	}
	want.OccurredAt = want.OccurredAt.Truncate(time.Microsecond)
	got := ev.envelope()
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Errorf("occurred at %v, want %v", got.OccurredAt, want.OccurredAt)
	}
	got.OccurredAt = want.OccurredAt
	if string(got.Payload) != string(want.Payload) {
		t.Errorf("payload %s, want %s", got.Payload, want.Payload)
	}
	got.Payload = want.Payload
	if got.EventID != want.EventID || got.EventType != want.EventType || got.EventVersion != want.EventVersion ||
		got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
		got.AggregateVersion != want.AggregateVersion || got.CorrelationID != want.CorrelationID ||
		got.CausationID != want.CausationID || got.Traceparent != want.Traceparent {
		t.Errorf("decoded %+v, want %+v", got, want)
	}
}

// rawEnvelope.validate refuses exactly what event.Envelope.Validate
// refuses: the relay's check of an emitted event is the writer's.
func TestRawEnvelopeValidatesAsTheEnvelope(t *testing.T) {
	long := string(make([]byte, event.MaxNameBytes+1))
	cases := map[string]func(*event.Envelope){
		"valid":                      func(*event.Envelope) {},
		"no event id":                func(e *event.Envelope) { e.EventID = uuid.Nil },
		"blank event type":           func(e *event.Envelope) { e.EventType = " \t" },
		"event version 0":            func(e *event.Envelope) { e.EventVersion = 0 },
		"event version too high":     func(e *event.Envelope) { e.EventVersion = event.MaxEventVersion + 1 },
		"blank aggregate type":       func(e *event.Envelope) { e.AggregateType = "" },
		"blank aggregate id":         func(e *event.Envelope) { e.AggregateID = "\n" },
		"aggregate version 0":        func(e *event.Envelope) { e.AggregateVersion = 0 },
		"aggregate version too high": func(e *event.Envelope) { e.AggregateVersion = event.MaxAggregateVersion + 1 },
		"no occurred at":             func(e *event.Envelope) { e.OccurredAt = time.Time{} },
		"occurred in year 10000":     func(e *event.Envelope) { e.OccurredAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
		"a long aggregate id":        func(e *event.Envelope) { e.AggregateID = "x" + long },
		"a NUL in the event type":    func(e *event.Envelope) { e.EventType = "a\x00b" },
		"bad UTF-8 in a causation":   func(e *event.Envelope) { e.CausationID = "\xff" },
		"a long traceparent":         func(e *event.Envelope) { e.Traceparent = string(make([]byte, event.MaxTraceparentBytes+1)) },
		"no payload":                 func(e *event.Envelope) { e.Payload = nil },
		"a payload that is an array": func(e *event.Envelope) { e.Payload = []byte(`[]`) },
		"a payload that is not JSON": func(e *event.Envelope) { e.Payload = []byte(`{"a":}`) },
		"a payload not UTF-8":        func(e *event.Envelope) { e.Payload = []byte("{\"a\":\"\xff\"}") },
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			ev := validEmitted()
			change(&ev)
			raw := rawEnvelope{eventID: ev.EventID, eventType: []byte(ev.EventType), eventVersion: int64(ev.EventVersion),
				aggType: []byte(ev.AggregateType), aggID: []byte(ev.AggregateID), aggVersion: ev.AggregateVersion,
				occurredAt: ev.OccurredAt, correlationID: []byte(ev.CorrelationID), causationID: []byte(ev.CausationID),
				traceparent: []byte(ev.Traceparent), payload: ev.Payload}
			want, got := ev.Validate(), raw.validate()
			if (want == nil) != (got == nil) || (got != nil && !errors.Is(got, event.ErrInvalid)) {
				t.Errorf("validate() = %v; event.Envelope.Validate() = %v", got, want)
			}
		})
	}
}
