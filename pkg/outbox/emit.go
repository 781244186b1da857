package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
)

// EmitPrefix is the logical decoding message prefix Emit writes under and
// CDCRelay reads; messages under any other prefix are left alone, so other
// tools may emit their own.
const EmitPrefix = "onceflow.outbox.v1"

// emitEvent writes the envelope into the WAL only. Postgres builds the JSON,
// so the payload goes through jsonb exactly as the outbox table's payload
// column does: a consumer gets the same bytes from either relay mode.
// Transactional (true): the message is decoded at the transaction's commit,
// in commit order with the transaction's other changes, and never if it
// rolls back.
const emitEvent = `
SELECT pg_logical_emit_message(true, $1::text, convert_to(jsonb_build_object(
    'eventId', $2::uuid, 'eventType', $3::text, 'eventVersion', $4::int,
    'aggregateType', $5::text, 'aggregateId', $6::text, 'aggregateVersion', $7::bigint,
    'occurredAt', $8::text, 'correlationId', $9::text, 'causationId', $10::text,
    'traceparent', $11::text, 'payload', $12::jsonb, 'emittedAt', clock_timestamp())::text, 'UTF8'))`

// walEnvelope is the JSON shape of an emitted event.
type walEnvelope struct {
	EventID          uuid.UUID       `json:"eventId"`
	EventType        string          `json:"eventType"`
	EventVersion     int             `json:"eventVersion"`
	AggregateType    string          `json:"aggregateType"`
	AggregateID      string          `json:"aggregateId"`
	AggregateVersion int64           `json:"aggregateVersion"`
	OccurredAt       string          `json:"occurredAt"`
	CorrelationID    string          `json:"correlationId"`
	CausationID      string          `json:"causationId"`
	Traceparent      string          `json:"traceparent"`
	Payload          json.RawMessage `json:"payload"`
	EmittedAt        time.Time       `json:"emittedAt"`
}

// Emit writes ev into the WAL alone, inside the caller's transaction, as a
// logical decoding message (pg_logical_emit_message, transactional): no
// outbox row, no index, no retention. Only a CDCRelay publishes it, at the
// transaction's commit, in commit order; the polling relay never sees it, so
// use Emit only in a service that runs the log-based relay (RELAY_MODE=wal).
// Like Enqueue, it never commits and never talks to Kafka, and an
// incomplete envelope is rejected with an error wrapping event.ErrInvalid.
func Emit(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("outbox: %s %s: %w", ev.EventType, ev.EventID, err)
	}
	// Truncated to the microsecond, as the outbox table's timestamptz stores
	// it, so the occurred-at header is the same in every mode.
	occurred := ev.OccurredAt.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
	_, err := tx.Exec(ctx, emitEvent, EmitPrefix, [16]byte(ev.EventID), ev.EventType, ev.EventVersion,
		ev.AggregateType, ev.AggregateID, ev.AggregateVersion, occurred, ev.CorrelationID, ev.CausationID,
		ev.Traceparent, []byte(ev.Payload))
	if err != nil {
		return fmt.Errorf("outbox: emitting %s %s: %w", ev.EventType, ev.EventID, err)
	}
	return nil
}

// decodeEmitted is the inverse of Emit, for the relay. A message that is
// not what Emit writes is refused with reason (refusedUndecodable or
// refusedInvalid) and err: pg_logical_emit_message is an ordinary function,
// so anything may be under the prefix, and the relay must neither publish
// it as genuine nor stop on it.
func decodeEmitted(content []byte) (ev event.Envelope, emittedAt time.Time, reason string, err error) {
	var w walEnvelope
	if err := json.Unmarshal(content, &w); err != nil {
		return event.Envelope{}, time.Time{}, refusedUndecodable, fmt.Errorf("decoding an emitted event: %w", err)
	}
	var occurred time.Time
	if w.OccurredAt != "" {
		if occurred, err = time.Parse(time.RFC3339Nano, w.OccurredAt); err != nil {
			return event.Envelope{}, time.Time{}, refusedInvalid, fmt.Errorf("event %s: decoding occurredAt: %w", w.EventID, err)
		}
	}
	ev = event.Envelope{
		EventID: w.EventID, EventType: w.EventType, EventVersion: w.EventVersion,
		AggregateType: w.AggregateType, AggregateID: w.AggregateID, AggregateVersion: w.AggregateVersion,
		OccurredAt: occurred, CorrelationID: w.CorrelationID, CausationID: w.CausationID,
		Traceparent: w.Traceparent, Payload: w.Payload,
	}
	if err := ev.Validate(); err != nil {
		return event.Envelope{}, time.Time{}, refusedInvalid, fmt.Errorf("event %s: %w", w.EventID, err)
	}
	if len(w.Payload) == 0 {
		return event.Envelope{}, time.Time{}, refusedInvalid, fmt.Errorf("event %s: %w: missing payload", w.EventID, event.ErrInvalid)
	}
	if w.EmittedAt.IsZero() {
		w.EmittedAt = occurred
	}
	return ev, w.EmittedAt, "", nil
}

// refusedContentShown is how much of a refused message the log shows: enough
// to tell a mistake from a forgery, bounded however large it is.
const refusedContentShown = 1024

// refuseEmitted skips a message under the outbox's prefix that is not a
// valid envelope: it goes dead where the WAL-only mode's dead events go
// (an error log record with its position, reason and content, and
// outbox_dead_total), counted by reason in outbox_emitted_refused_total. It
// is never published, and the stream goes on.
func (r *CDCRelay) refuseEmitted(ctx context.Context, reason string, cause error, lsn pglogrepl.LSN, content []byte) {
	r.cfg.Metrics.deadTotal.Inc()
	r.cfg.Metrics.cdc.emittedRefused.WithLabelValues(reason).Inc()
	shown := content
	if len(shown) > refusedContentShown {
		shown = shown[:refusedContentShown]
	}
	r.cfg.Logger.ErrorContext(ctx, "outbox: refused a message in the WAL under the outbox's prefix that is not a valid envelope; "+
		"skipped as dead, never published (only Emit, run by the service's own role, should write there)",
		slog.String("reason", reason), slog.String("lsn", lsn.String()), slog.Int("content_bytes", len(content)),
		slog.String("content", string(shown)), slog.Any("error", cause))
}
