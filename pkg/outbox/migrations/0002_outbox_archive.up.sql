-- Where Prune moves published events when PruneConfig.Archive is set, for
-- audits after they left outbox_events. The columns mirror outbox_events, but
-- id is a plain key, not an identity: an archived row keeps the id it was
-- published under, so logs and audits that name an outbox id still find it.
CREATE TABLE outbox_events_archive (
    id                bigint      PRIMARY KEY,
    -- Not UNIQUE: outbox_events cannot see this table, so an event id reused
    -- after its first row was archived must not make every later prune fail.
    event_id          uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    event_version     int         NOT NULL,
    payload           jsonb       NOT NULL,
    headers           jsonb       NOT NULL,
    occurred_at       timestamptz NOT NULL,
    created_at        timestamptz NOT NULL,
    partition         smallint    NOT NULL,
    state             text        NOT NULL,
    attempts          int         NOT NULL,
    next_attempt_at   timestamptz NOT NULL,
    last_error        text,
    published_at      timestamptz,
    archived_at       timestamptz NOT NULL DEFAULT now()
);

-- Audits ask "what happened to event X" and "what did aggregate Y emit".
CREATE INDEX outbox_events_archive_event_id_idx ON outbox_events_archive (event_id);
CREATE INDEX outbox_events_archive_aggregate_idx ON outbox_events_archive (aggregate_type, aggregate_id, aggregate_version);
