package outbox

import (
	"testing"
)

// What the log-based relay makes of a message under EmitPrefix: Emit's
// shape is accepted, anything else refused with the reason it is counted
// under, never published.
func TestDecodeEmitted(t *testing.T) {
	const valid = `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
		`"aggregateType":"payment","aggregateId":"p-1","aggregateVersion":1,"occurredAt":"2026-01-02T03:04:05.123456Z",` +
		`"correlationId":"","causationId":"","traceparent":"","payload":{"amount":100},"emittedAt":"2026-01-02T03:04:05.2Z"}`
	for _, tc := range []struct {
		name, content, reason string
	}{
		{"what Emit writes", valid, ""},
		{"not JSON", `PaymentCaptured 100`, refusedUndecodable},
		{"a JSON array", `[1,2]`, refusedUndecodable},
		{"a bad event id", `{"eventId":"nope"}`, refusedUndecodable},
		{"no event id", `{"eventType":"PaymentCaptured","eventVersion":1,"aggregateType":"payment","aggregateId":"p-1",` +
			`"aggregateVersion":1,"occurredAt":"2026-01-02T03:04:05Z","payload":{}}`, refusedInvalid},
		{"no aggregate", `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
			`"occurredAt":"2026-01-02T03:04:05Z","payload":{}}`, refusedInvalid},
		{"a bad occurredAt", `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
			`"aggregateType":"payment","aggregateId":"p-1","aggregateVersion":1,"occurredAt":"yesterday","payload":{}}`, refusedInvalid},
		{"no payload", `{"eventId":"6f1c2b4e-8a1d-4c3e-9b7a-2d5e6f708192","eventType":"PaymentCaptured","eventVersion":1,` +
			`"aggregateType":"payment","aggregateId":"p-1","aggregateVersion":1,"occurredAt":"2026-01-02T03:04:05Z"}`, refusedInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, _, reason, err := decodeEmitted([]byte(tc.content))
			if reason != tc.reason || (err == nil) != (tc.reason == "") {
				t.Fatalf("decodeEmitted = reason %q, error %v; want reason %q", reason, err, tc.reason)
			}
			if err == nil {
				if verr := ev.Validate(); verr != nil {
					t.Errorf("accepted an envelope that does not validate: %v", verr)
				}
			}
		})
	}
}
