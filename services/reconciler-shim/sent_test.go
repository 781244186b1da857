package shim

import (
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// record takes what forward put only for the very envelope it forwarded,
// once; anything else is decoded again.
func TestSentPaymentsAreTakenOnlyForTheSameBytes(t *testing.T) {
	t.Parallel()
	ev := event.Envelope{EventID: uuid.New(), EventType: EventPaymentCaptured, EventVersion: 1,
		Payload: []byte(`{"paymentId":"6ba7b810-9dad-11d1-80b4-00c04fd430c8"}`)}
	req := thirdparty.SettleRequest{PaymentID: "6ba7b810-9dad-11d1-80b4-00c04fd430c8", Kind: thirdparty.KindCapture}
	for _, tt := range []struct {
		name   string
		change func(*event.Envelope)
		want   bool
	}{
		{"the same envelope", func(*event.Envelope) {}, true},
		{"another event id", func(e *event.Envelope) { e.EventID = uuid.New() }, false},
		{"another payload", func(e *event.Envelope) { e.Payload = []byte(`{}`) }, false},
		{"another type", func(e *event.Envelope) { e.EventType = EventPaymentRefunded }, false},
		{"another version", func(e *event.Envelope) { e.EventVersion = 2 }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s sentPayments
			s.put(ev, req, payment{AmountCents: 7})
			other := ev
			other.Payload = append([]byte(nil), ev.Payload...) // equal bytes, another array
			tt.change(&other)
			got, p, ok := s.take(other)
			if ok != tt.want || (ok && (got != req || p.AmountCents != 7)) {
				t.Fatalf("take = %+v, %+v, %v; want found %v", got, p, ok, tt.want)
			}
			if _, _, again := s.take(ev); ok && again {
				t.Fatal("taken twice")
			}
		})
	}
}

// Forwards whose record never comes do not pile up.
func TestSentPaymentsAreBounded(t *testing.T) {
	t.Parallel()
	var s sentPayments
	for range 3 * maxSent {
		s.put(event.Envelope{EventID: uuid.New()}, thirdparty.SettleRequest{}, payment{})
	}
	if n := len(s.m); n > maxSent {
		t.Fatalf("%d forwards kept, want at most %d", n, maxSent)
	}
}

// BenchmarkRecordReading is what record spends to read one payment: decoding
// it again (before) or taking what forward decoded (now).
func BenchmarkRecordReading(b *testing.B) {
	ev := event.Envelope{EventID: uuid.New(), EventType: EventPaymentCaptured, EventVersion: 1,
		Payload: []byte(`{"paymentId":"0b5a3f3e-7c1d-4f57-9a3e-2d6c1f8e9a10","orderId":"9d1c2b7a-5e4f-4a3b-8c2d-1e0f9a8b7c6d","amountCents":57311,"currency":"EUR","orderEventAt":"2026-11-28T17:30:00.123456Z"}`)}
	req, p, ok, err := request(ev)
	if err != nil || !ok {
		b.Fatal(err)
	}
	b.Run("impl=decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := request(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=sent", func(b *testing.B) {
		var s sentPayments
		b.ReportAllocs()
		for b.Loop() {
			s.put(ev, req, p)
			if _, _, ok := s.take(ev); !ok {
				b.Fatal("missed")
			}
		}
	})
}
