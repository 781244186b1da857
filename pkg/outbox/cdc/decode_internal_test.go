package cdc

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// envelope is ev as an event.Envelope, for comparisons.
func (ev *rawEnvelope) envelope() event.Envelope {
	return event.Envelope{
		EventID: ev.eventID, EventType: string(ev.eventType), EventVersion: int(ev.eventVersion),
		AggregateType: string(ev.aggType), AggregateID: string(ev.aggID), AggregateVersion: ev.aggVersion,
		OccurredAt: ev.occurredAt, CorrelationID: string(ev.correlationID), CausationID: string(ev.causationID),
		Traceparent: string(ev.traceparent), Payload: bytes.Clone(ev.payload),
	}
}

// The relay's messages are event.ToKafka's, byte for byte, however the
// optional fields are set and however many events share the builder's
// blocks; and a header added to one message later (the producer span's
// traceparent) leaves the others alone.
func TestMsgBuilderMatchesToKafka(t *testing.T) {
	b := newMsgBuilder(func(aggType string) string { return aggType + ".events" })
	var built []kafka.Message
	var want []kafka.Message
	for i := range 3000 {
		ev := rawEnvelope{
			eventID: uuid.New(), eventType: []byte("OrderPlaced"), eventVersion: int64(1 + i%3),
			aggType: []byte([]string{"order", "payment"}[i%2]), aggID: fmt.Appendf(nil, "agg-%d", i%17),
			aggVersion: int64(i + 1), occurredAt: time.Date(2026, 11, 25, 1, 2, 3, (i%7)*1000, time.FixedZone("", 3600)),
			payload: bytes.Repeat([]byte("x"), i%5000),
		}
		if i%2 == 0 {
			ev.correlationID = []byte("corr")
		}
		if i%3 == 0 {
			ev.causationID = []byte("cause")
		}
		if i%5 != 0 {
			ev.traceparent = []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		}
		c := b.build(&ev)
		if c.Aggregate != string(ev.aggType)+"\x00"+string(ev.aggID) || c.AggType != string(ev.aggType) {
			t.Fatalf("event %d: aggregate %q, type %q", i, c.Aggregate, c.AggType)
		}
		env := ev.envelope()
		env.Payload = bytes.Clone(ev.payload)
		built = append(built, c.Msg)
		want = append(want, event.ToKafka(string(ev.aggType)+".events", env))
		// The decoder's buffer is reused for the next event.
		clear(ev.payload)
	}
	publish.SetHeader(&built[0], event.HeaderTraceparent, "changed")
	built[0] = want[0]
	for i := range built {
		if !publish.SameMessage(built[i], want[i]) || built[i].Topic != want[i].Topic {
			t.Fatalf("event %d:\n built %s %q %v\n want  %s %q %v", i, built[i].Topic, built[i].Key, headerText(built[i]),
				want[i].Topic, want[i].Key, headerText(want[i]))
		}
	}
}

func headerText(m kafka.Message) []string {
	var out []string
	for _, h := range m.Headers {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

// timestamptz_out's ISO text in any zone, read in place; the shapes it does
// not read fall back to pgtype, as the polling relay reads them.
func TestParseTimestamptz(t *testing.T) {
	for _, tc := range []struct {
		text string
		want time.Time
	}{
		{"2026-11-25 01:02:03+00", time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)},
		{"2026-11-25 01:02:03.5+00", time.Date(2026, 11, 25, 1, 2, 3, 500_000_000, time.UTC)},
		{"2026-11-25 01:02:03.123456+00", time.Date(2026, 11, 25, 1, 2, 3, 123_456_000, time.UTC)},
		{"2026-11-25 03:02:03.000001+02", time.Date(2026, 11, 25, 1, 2, 3, 1000, time.UTC)},
		{"2026-11-24 20:32:03-04:30", time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)},
		{"1900-01-01 00:00:00+00:09:21", time.Date(1899, 12, 31, 23, 50, 39, 0, time.UTC)},
		{"2024-02-29 12:00:00+00", time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC)},
		{"0044-03-15 12:00:00+00 BC", time.Date(-43, 3, 15, 12, 0, 0, 0, time.UTC)},
	} {
		got, err := parseTimestamptz([]byte(tc.text))
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("parseTimestamptz(%q) = %v, %v; want %v", tc.text, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "2026-02-30 00:00:00+00", "2026-11-25T01:02:03Z", "2026-11-25 01:02:03+0", "2026-11-25 01:02:03+00:"} {
		if _, ok := parseISOTimestamptz([]byte(bad)); ok {
			t.Errorf("parseISOTimestamptz(%q) read it", bad)
		}
	}
}

// The headers column is read in place when it is the flat object of plain
// strings Enqueue writes, and through encoding/json otherwise: the same
// values either way.
func TestReadHeaders(t *testing.T) {
	for _, tc := range []struct {
		json, corr, cause, trace string
	}{
		{`{}`, "", "", ""},
		{`{"traceparent": "00-abc-01", "correlationId": "c-1"}`, "c-1", "", "00-abc-01"},
		{`{"causationId":"x","correlationId":"y","traceparent":"z","other":"w"}`, "y", "x", "z"},
		{`{"correlationId": "with \"quotes\" and \u00e9"}`, `with "quotes" and é`, "", ""},
		{`{"correlationId": "c", "n": 1}`, "c", "", ""},
	} {
		var ev rawEnvelope
		if err := ev.readHeaders([]byte(tc.json)); err != nil {
			t.Errorf("readHeaders(%s): %v", tc.json, err)
			continue
		}
		if string(ev.correlationID) != tc.corr || string(ev.causationID) != tc.cause || string(ev.traceparent) != tc.trace {
			t.Errorf("readHeaders(%s) = %q %q %q", tc.json, ev.correlationID, ev.causationID, ev.traceparent)
		}
	}
	var ev rawEnvelope
	if err := ev.readHeaders([]byte(`{"correlationId": `)); err == nil {
		t.Error("readHeaders read a broken object")
	}
}
