-- The inbox's lifecycle as one guarded state machine (state.go, docs/inbox.md).

-- The aggregate type of each row: a dead leased event moves its aggregate's
-- version guard back to what that aggregate (type and id) applied, never to
-- another type's that shares the id. NULL on rows written before this
-- migration, which the move-back then ignores (going back too far is safe:
-- the inbox rows still dedupe).
ALTER TABLE inbox_messages ADD COLUMN aggregate_type text;

-- may_have_called: lease mode, a call for this message may have landed at
-- the other side (a call that failed, a lease taken over). A dead letter
-- keeps it, and so does its requeue: the redelivery checks before calling.
ALTER TABLE inbox_messages ADD COLUMN may_have_called boolean NOT NULL DEFAULT false;

-- Statuses, all of them: leased, processed, stale, dead_lettered, requeued
-- (an operator sent the dead letter back; its redelivery applies it),
-- uncertain, skipped (an operator skipped it, with a reason).

-- inbox_dead_letter_originals: the whole message of a dead letter that the
-- dead-letter topic took only truncated (in_topic), or refused even so (not
-- in_topic: a requeue by event id sends it from here), so that a requeue
-- sends the original, never a copy that does not decode.
CREATE TABLE inbox_dead_letter_originals (
    consumer        text        NOT NULL,
    message_id      uuid        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL,
    kafka_offset    bigint      NOT NULL,
    msg_key         bytea,
    msg_value       bytea       NOT NULL,
    -- The Kafka headers as [{"key": …, "value": base64}], in order.
    msg_headers     jsonb       NOT NULL DEFAULT '[]',
    in_topic        boolean     NOT NULL DEFAULT true,
    -- The dead-letter topic the letter went to (or was refused by).
    dead_letter_topic text      NOT NULL,
    stored_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- inbox_operator_actions: what operators did to held aggregates (release,
-- skip), with their reason: the record an audit reads.
CREATE TABLE inbox_operator_actions (
    id             bigserial   PRIMARY KEY,
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    action         text        NOT NULL,
    reason         text        NOT NULL,
    operator       text        NOT NULL DEFAULT '',
    dead_messages  uuid[]      NOT NULL DEFAULT '{}',
    parked         int         NOT NULL DEFAULT 0,
    acted_at       timestamptz NOT NULL DEFAULT now()
);
