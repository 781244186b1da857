-- The version guard: the highest aggregate version each consumer has applied
-- per aggregate. An event at or below it is stale (skipped and counted); one
-- more than a step above it reveals a gap.
CREATE TABLE inbox_aggregate_versions (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);

-- Lease mode, for side effects outside the database: a row is 'leased' to
-- one worker (lease_owner) until lease_until while it calls out; the fencing
-- token grows with every new lease, so a worker whose lease was taken over
-- cannot mark the row done. 'uncertain' marks a message whose side effect may
-- or may not have happened, for the reconciliation report.
ALTER TABLE inbox_messages
    ADD COLUMN lease_owner   text,
    ADD COLUMN lease_until   timestamptz,
    ADD COLUMN fencing_token bigint NOT NULL DEFAULT 0;

CREATE INDEX inbox_messages_uncertain_idx ON inbox_messages (consumer, received_at) WHERE status = 'uncertain';
