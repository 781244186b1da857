package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// insertEvent writes one pending event. The logical partition is computed by
// Postgres from the aggregate id so every writer, in any language, agrees;
// the partition count is passed in ($10, always partitionCount) so that the
// constant the relay divides the work by is the only place it is written.
// The correlation id, causation id and traceparent are written twice: in
// headers, which the platform's relays read, and as columns of their own,
// which an external publisher (Debezium's EventRouter) places as Kafka
// headers (migration 0007). Empty is NULL, as the relays omit the header.
const insertEvent = `
INSERT INTO outbox_events (
    event_id, aggregate_type, aggregate_id, aggregate_version,
    event_type, event_version, payload, headers, occurred_at, partition,
    correlation_id, causation_id, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, mod(hashtext($3)::bigint + 2147483648, $10),
    nullif($11, ''), nullif($12, ''), nullif($13, ''))
`

// Enqueue writes ev to the outbox inside the caller's transaction, so the
// event commits if and only if the domain change beside it commits. It never
// commits and never talks to Kafka. An event missing a required envelope
// field is rejected with an error wrapping event.ErrInvalid.
func Enqueue(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return EnqueueBatch(ctx, tx, ev)
}

// EnqueueBatch writes several events in one round trip, in order.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, evs ...event.Envelope) error {
	var b pgx.Batch
	if err := Queue(&b, evs...); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("outbox: inserting events: %w", err)
	}
	return nil
}

// Queue queues the writes of evs onto b, in order, for a caller that sends
// its own statements and the events' in one round trip (a pgx.Batch: a
// pipeline). b must run in one transaction — it begins with BEGIN, or the
// caller sends it without one and pgx runs it as a single implicit
// transaction — so that the events commit if and only if the caller's
// statements do. The result of each queued statement is a command tag
// (BatchResults.Exec); an error there is the outbox insert's. An event
// missing a required envelope field is rejected here, before anything is
// sent, with an error wrapping event.ErrInvalid.
func Queue(b *pgx.Batch, evs ...event.Envelope) error {
	for _, ev := range evs {
		if err := ev.Validate(); err != nil {
			return fmt.Errorf("outbox: %s %s: %w", ev.EventType, ev.EventID, err)
		}
		headers, err := json.Marshal(publish.Headers{
			CorrelationID: ev.CorrelationID,
			CausationID:   ev.CausationID,
			Traceparent:   ev.Traceparent,
		})
		if err != nil {
			return fmt.Errorf("outbox: encoding headers: %w", err)
		}
		// [16]byte, not uuid.UUID: pgx encodes it natively instead of through
		// driver.Valuer and text.
		b.Queue(insertEvent, [16]byte(ev.EventID), ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
			ev.EventType, ev.EventVersion, []byte(ev.Payload), headers, ev.OccurredAt, partitionCount,
			ev.CorrelationID, ev.CausationID, ev.Traceparent)
	}
	return nil
}
