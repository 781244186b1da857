ALTER TABLE outbox_events
    DROP COLUMN IF EXISTS correlation_id,
    DROP COLUMN IF EXISTS causation_id,
    DROP COLUMN IF EXISTS traceparent;
ALTER TABLE outbox_events_archive
    DROP COLUMN IF EXISTS correlation_id,
    DROP COLUMN IF EXISTS causation_id,
    DROP COLUMN IF EXISTS traceparent;
