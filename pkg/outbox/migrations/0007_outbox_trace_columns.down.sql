ALTER TABLE outbox_events
    DROP COLUMN IF EXISTS correlation_id,
    DROP COLUMN IF EXISTS causation_id,
    DROP COLUMN IF EXISTS traceparent;
