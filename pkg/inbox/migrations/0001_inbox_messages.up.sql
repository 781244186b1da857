-- The inbox: one row per (consumer, message) this consumer has handled,
-- written in the same transaction as the handler's side effects. The primary
-- key is the dedupe: a redelivered message finds its row and is acknowledged
-- without running the handler again.
CREATE TABLE inbox_messages (
    consumer          text        NOT NULL,
    message_id        uuid        NOT NULL,
    event_type        text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    -- Where the first delivery came from, for audits and dead-letter requeues.
    topic             text        NOT NULL,
    kafka_partition   int         NOT NULL,
    kafka_offset      bigint      NOT NULL,
    -- processed: the handler's effects committed with this row.
    -- dead_lettered: the message went to the dead-letter topic; see last_error.
    status            text        NOT NULL,
    attempts          int         NOT NULL DEFAULT 1,
    last_error        text,
    -- sha256 of the payload: a redelivery with the same id but another body
    -- is a producer bug worth seeing.
    payload_hash      bytea       NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    processed_at      timestamptz,
    PRIMARY KEY (consumer, message_id)
);

-- Retention prunes processed rows by age.
CREATE INDEX inbox_messages_processed_at_idx ON inbox_messages (processed_at) WHERE status = 'processed';
