package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// NewID returns a new event id: a UUIDv7, so ids created later sort later.
// The unique indexes on event ids (the outbox's event_id, the inbox's
// message_id) then grow at their right edge, like a sequence, instead of
// touching a random page per insert. Use it for any id that is indexed.
func NewID() uuid.UUID {
	return uuid.Must(uuid.NewV7())
}

// Envelope is the metadata and payload of one event.
type Envelope struct {
	// EventID identifies the event; consumers dedupe on it. It survives
	// relays, retries and replays unchanged.
	EventID uuid.UUID
	// EventType names the fact, in the past tense: "OrderPlaced".
	EventType string
	// EventVersion is the version of the payload schema for EventType, from 1.
	EventVersion int
	// AggregateType names the kind of entity the event is about: "order".
	AggregateType string
	// AggregateID identifies the entity; it is the Kafka key.
	AggregateID string
	// AggregateVersion numbers the aggregate's events from 1 without gaps, so
	// a consumer can tell stale, duplicate and missing events apart.
	AggregateVersion int64
	// OccurredAt is when the fact happened, in the producer's clock.
	OccurredAt time.Time
	// CorrelationID ties together every event caused by one user request.
	CorrelationID string
	// CausationID is the id of the command or event that caused this one.
	CausationID string
	// Traceparent is the W3C trace context of the work that produced the event.
	Traceparent string
	// Payload is the event's body, a JSON object.
	Payload json.RawMessage
}

// ErrInvalid is wrapped by every validation and decoding error, so callers can
// tell a permanently bad event (dead-letter it) from a transient failure.
var ErrInvalid = errors.New("invalid event")

// Validate reports the first missing or malformed required field.
func (e Envelope) Validate() error {
	var missing []string
	if e.EventID == uuid.Nil {
		missing = append(missing, "event id")
	}
	if strings.TrimSpace(e.EventType) == "" {
		missing = append(missing, "event type")
	}
	if e.EventVersion < 1 {
		missing = append(missing, "event version (>= 1)")
	}
	if strings.TrimSpace(e.AggregateType) == "" {
		missing = append(missing, "aggregate type")
	}
	if strings.TrimSpace(e.AggregateID) == "" {
		missing = append(missing, "aggregate id")
	}
	if e.AggregateVersion < 1 {
		missing = append(missing, "aggregate version (>= 1)")
	}
	if e.OccurredAt.IsZero() {
		missing = append(missing, "occurred at")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s", ErrInvalid, strings.Join(missing, ", "))
	}
	// The header carries OccurredAt in UTC as RFC 3339, which has four-digit
	// years only: "0000-01-01T00:30:00+01:00" parses, but its UTC form (year
	// -1) could not be encoded again by a relay or a dead-letter requeue.
	if y := e.OccurredAt.UTC().Year(); y < 1 || y > 9999 {
		return fmt.Errorf("%w: occurred at is outside the years 1 to 9999 in UTC", ErrInvalid)
	}
	if !json.Valid(e.Payload) || len(e.Payload) == 0 || e.Payload[0] != '{' {
		return fmt.Errorf("%w: payload is not a JSON object", ErrInvalid)
	}
	return nil
}

// DecodePayload unmarshals the payload into v. Unknown fields are ignored
// (producers may add fields; that is how contracts evolve), but a payload
// that is not JSON or has a field of the wrong type is a permanent error and
// wraps ErrInvalid. Callers check the fields they require themselves.
func (e Envelope) DecodePayload(v any) error {
	if err := json.Unmarshal(e.Payload, v); err != nil {
		return fmt.Errorf("%w: decoding %s v%d payload: %v", ErrInvalid, e.EventType, e.EventVersion, err)
	}
	return nil
}
