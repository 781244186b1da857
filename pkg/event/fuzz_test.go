package event_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
)

// FuzzFromKafka feeds FromKafka arbitrary keys, values and header values
// (each envelope header, an unknown header, and a repeated event-id header).
// Properties: it never panics; every error wraps ErrInvalid (a message that
// cannot be decoded is dead-lettered, never retried); an accepted envelope
// validates, and survives ToKafka then FromKafka unchanged, because the relay
// and the dead-letter requeue re-encode what consumers decoded.
func FuzzFromKafka(f *testing.F) {
	valid := event.ToKafka("t", event.Envelope{
		EventID: event.NewID(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: "o-1", AggregateVersion: 3, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		CorrelationID: "req-1", CausationID: "key-1", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		Payload: []byte(`{"orderId":"o-1"}`),
	})
	hv := map[string]string{}
	for _, h := range valid.Headers {
		hv[h.Key] = string(h.Value)
	}
	add := func(key, value []byte, id, typ, ver, aggType, aggID, aggVer, at, corr, cause, tp, extra, dupID string) {
		f.Add(key, value, id, typ, ver, aggType, aggID, aggVer, at, corr, cause, tp, extra, dupID)
	}
	add(valid.Key, valid.Value, hv[event.HeaderEventID], hv[event.HeaderEventType], hv[event.HeaderEventVersion],
		hv[event.HeaderAggregateType], hv[event.HeaderAggregateID], hv[event.HeaderAggregateVersion], hv[event.HeaderOccurredAt],
		hv[event.HeaderCorrelationID], hv[event.HeaderCausationID], hv[event.HeaderTraceparent], "", "")
	add([]byte("o-1"), []byte(`{}`), hv[event.HeaderEventID], "T", "1", "order", "o-1", "1", "2026-01-02T03:04:05+02:00", "", "", "", "x", "")
	add([]byte("o-1"), []byte(`not json`), "not-a-uuid", "", "-1", "", "o-2", "9223372036854775808", "yesterday", "\x00", "\xff", "", "", "")
	add(nil, nil, "", "", "", "", "", "", "", "", "", "", "", "")
	add([]byte("k\x00"), []byte(`{"a":"\u0000"}`), hv[event.HeaderEventID], "T\xff", "1", "a", "k\x00", "1", "0001-01-01T00:00:00Z", "", "", "", "", event.NewID().String())
	f.Fuzz(func(t *testing.T, key, value []byte, id, typ, ver, aggType, aggID, aggVer, at, corr, cause, tp, extra, dupID string) {
		m := kafka.Message{Topic: "t", Key: key, Value: value, Headers: []kafka.Header{
			{Key: event.HeaderEventID, Value: []byte(id)},
			{Key: event.HeaderEventType, Value: []byte(typ)},
			{Key: event.HeaderEventVersion, Value: []byte(ver)},
			{Key: event.HeaderAggregateType, Value: []byte(aggType)},
			{Key: event.HeaderAggregateID, Value: []byte(aggID)},
			{Key: event.HeaderAggregateVersion, Value: []byte(aggVer)},
			{Key: event.HeaderOccurredAt, Value: []byte(at)},
			{Key: event.HeaderCorrelationID, Value: []byte(corr)},
			{Key: event.HeaderCausationID, Value: []byte(cause)},
			{Key: event.HeaderTraceparent, Value: []byte(tp)},
			{Key: "x-unknown", Value: []byte(extra)},
		}}
		if dupID != "" {
			m.Headers = append(m.Headers, kafka.Header{Key: event.HeaderEventID, Value: []byte(dupID)})
		}
		e, err := event.FromKafka(m)
		if err != nil {
			if !errors.Is(err, event.ErrInvalid) {
				t.Fatalf("FromKafka error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("FromKafka accepted an envelope that does not validate: %v", err)
		}
		again, err := event.FromKafka(event.ToKafka("t", e))
		if err != nil {
			t.Fatalf("an accepted envelope does not survive ToKafka/FromKafka: %v\n%+v", err, e)
		}
		if again.EventID != e.EventID || again.EventType != e.EventType || again.EventVersion != e.EventVersion ||
			again.AggregateType != e.AggregateType || again.AggregateID != e.AggregateID ||
			again.AggregateVersion != e.AggregateVersion || !again.OccurredAt.Equal(e.OccurredAt) ||
			again.CorrelationID != e.CorrelationID || again.CausationID != e.CausationID ||
			again.Traceparent != e.Traceparent || !bytes.Equal(again.Payload, e.Payload) {
			t.Fatalf("round trip changed the envelope:\n was %+v\n now %+v", e, again)
		}
	})
}
