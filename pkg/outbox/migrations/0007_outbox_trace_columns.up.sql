-- The correlation id, causation id and traceparent as columns of their own,
-- beside the headers jsonb the platform's relays read. An external
-- publisher reading the table's change stream (Debezium's outbox EventRouter,
-- docs/debezium) can place a column as a Kafka header but cannot spread one
-- JSON column over several headers; without these columns its events reached
-- Kafka with no correlation and a broken trace. Enqueue writes both forms in
-- the same statement; NULL when the envelope field is empty, as the relays
-- leave the header out then.
--
-- Plain columns, not generated ones: before PostgreSQL 18, logical
-- replication (pgoutput) does not publish generated columns, so Debezium
-- would see them NULL.
ALTER TABLE outbox_events
    ADD COLUMN correlation_id text,
    ADD COLUMN causation_id   text,
    ADD COLUMN traceparent    text;

-- The archive mirrors outbox_events (migration 0002).
ALTER TABLE outbox_events_archive
    ADD COLUMN correlation_id text,
    ADD COLUMN causation_id   text,
    ADD COLUMN traceparent    text;

-- Rows written before this migration: requeue and replay copy these columns,
-- so they must agree with headers there too.
UPDATE outbox_events
SET correlation_id = headers->>'correlationId',
    causation_id   = headers->>'causationId',
    traceparent    = headers->>'traceparent'
WHERE headers <> '{}'::jsonb;
