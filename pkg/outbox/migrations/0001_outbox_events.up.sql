-- The outbox: events written in the same transaction as the domain change
-- they describe, waiting for the relay to publish them to Kafka.
CREATE TABLE outbox_events (
    -- Commit-independent insertion order; the relay publishes in id order.
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          uuid        NOT NULL UNIQUE,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL CHECK (aggregate_version > 0),
    event_type        text        NOT NULL,
    event_version     int         NOT NULL CHECK (event_version > 0),
    payload           jsonb       NOT NULL,
    -- correlation id, causation id, traceparent: travel as Kafka headers.
    headers           jsonb       NOT NULL DEFAULT '{}',
    occurred_at       timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Logical partition of the aggregate (hash of aggregate_id), the unit of
    -- ordering a relay owns.
    partition         smallint    NOT NULL,
    state             text        NOT NULL DEFAULT 'pending'
                                  CHECK (state IN ('pending', 'published', 'dead')),
    attempts          int         NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT '-infinity',
    last_error        text,
    published_at      timestamptz
);

-- Claiming reads only pending rows; a partial index stays small however many
-- published rows the table holds.
CREATE INDEX outbox_events_pending_idx ON outbox_events (id) WHERE state = 'pending';
CREATE INDEX outbox_events_dead_idx ON outbox_events (id) WHERE state = 'dead';
-- Retention prunes published rows by age.
CREATE INDEX outbox_events_published_at_idx ON outbox_events (published_at) WHERE state = 'published';
-- Replay scopes by aggregate.
CREATE INDEX outbox_events_aggregate_idx ON outbox_events (aggregate_type, aggregate_id, aggregate_version);

-- Wake the relay when a transaction that wrote events commits: NOTIFY is
-- delivered only on commit, once per transaction and channel.
CREATE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();
