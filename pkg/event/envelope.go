package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

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

// Limits on envelope fields. Postgres stores every one of them (the inbox
// and outbox tables, the services' own rows), so an event outside them is
// refused here, where the refusal is a clear ErrInvalid, instead of by a
// database error on every retry. The services' identifiers (UUIDs, short
// type names, W3C traceparents of 55 bytes) fit with room to spare.
const (
	// MaxNameBytes bounds EventType, AggregateType, AggregateID,
	// CorrelationID and CausationID.
	MaxNameBytes = 200
	// MaxTraceparentBytes bounds Traceparent (version 00 uses 55).
	MaxTraceparentBytes = 512
	// MaxEventVersion bounds EventVersion: schemas are versioned one step
	// at a time, so thousands of versions means a corrupt header.
	MaxEventVersion = 10_000
	// MaxAggregateVersion bounds AggregateVersion at 2^53, the largest
	// integer every JSON reader keeps exact.
	MaxAggregateVersion = 1 << 53
)

// checkText refuses what a Postgres text column refuses (NUL bytes and
// invalid UTF-8, SQLSTATE 22021) and what no identifier needs (over max bytes).
func checkText(field, v string, max int) error {
	switch {
	case len(v) > max:
		return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalid, field, len(v), max)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, field)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s holds a NUL byte", ErrInvalid, field)
	}
	return nil
}

// Validate reports the first missing or malformed required field, and
// refuses fields outside the limits above.
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
	for _, f := range [...]struct {
		name, v string
		max     int
	}{
		{"event type", e.EventType, MaxNameBytes},
		{"aggregate type", e.AggregateType, MaxNameBytes},
		{"aggregate id", e.AggregateID, MaxNameBytes},
		{"correlation id", e.CorrelationID, MaxNameBytes},
		{"causation id", e.CausationID, MaxNameBytes},
		{"traceparent", e.Traceparent, MaxTraceparentBytes},
	} {
		if err := checkText(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	if e.EventVersion > MaxEventVersion {
		return fmt.Errorf("%w: event version %d is above %d", ErrInvalid, e.EventVersion, MaxEventVersion)
	}
	if e.AggregateVersion > MaxAggregateVersion {
		return fmt.Errorf("%w: aggregate version %d is above %d", ErrInvalid, e.AggregateVersion, int64(MaxAggregateVersion))
	}
	if !utf8.Valid(e.Payload) {
		return fmt.Errorf("%w: payload is not valid UTF-8", ErrInvalid)
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
