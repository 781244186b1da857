-- Relays that share one outbox register here and heartbeat; each takes a fair
-- share of the logical partitions (held as session advisory locks), so the
-- share is Partitions / live relays.
CREATE TABLE outbox_relays (
    id           text        PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Rows that hold back the later events of their aggregate: dead rows, and
-- pending rows waiting out a retry backoff (fresh rows have next_attempt_at
-- = '-infinity'). Normally empty, so the claim's per-row check is one probe.
CREATE INDEX outbox_events_blocking_idx ON outbox_events (aggregate_type, aggregate_id, id)
    WHERE state = 'dead' OR (state = 'pending' AND next_attempt_at > '-infinity');
