-- Per-key parking (as Axon's sequenced dead-letter queue): while a message of
-- an aggregate is dead, the later messages of that aggregate wait here
-- instead of being applied out of order, and the partition moves on for
-- every other aggregate.

-- inbox_dead_keys: the aggregates held by a dead message, one row per dead
-- message that decoded. 'dead' until an operator requeues it ('requeued':
-- the aggregate stays held until the requeued message is applied, so that a
-- later version still in the partition ahead of it is parked, not applied).
CREATE TABLE inbox_dead_keys (
    consumer          text        NOT NULL,
    message_id        uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    status            text        NOT NULL DEFAULT 'dead',
    dead_at           timestamptz NOT NULL DEFAULT now(),
    requeued_at       timestamptz,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_dead_keys_aggregate_idx ON inbox_dead_keys (consumer, aggregate_type, aggregate_id);

-- inbox_parked_messages: the messages held behind a dead one, whole (key,
-- value, headers), so they can be applied from here once it is requeued and
-- applied; seq is their arrival order, the order they are released in.
CREATE TABLE inbox_parked_messages (
    consumer          text        NOT NULL,
    message_id        uuid        NOT NULL,
    seq               bigserial   NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    -- The dead message it waits for when it was parked (NULL: it was parked
    -- behind earlier parked messages of its aggregate being released).
    blocked_by        uuid,
    topic             text        NOT NULL,
    kafka_partition   int         NOT NULL,
    kafka_offset      bigint      NOT NULL,
    msg_key           bytea,
    msg_value         bytea       NOT NULL,
    -- The Kafka headers as [{"key": …, "value": base64}], in order.
    msg_headers       jsonb       NOT NULL DEFAULT '[]',
    parked_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_parked_messages_aggregate_idx ON inbox_parked_messages (consumer, aggregate_type, aggregate_id, seq);
CREATE INDEX inbox_parked_messages_parked_at_idx ON inbox_parked_messages (parked_at);
