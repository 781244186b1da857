-- The log-based relay (CDCRelay) reads outbox_events inserts from a logical
-- replication slot through this publication (pgoutput). Only inserts: the
-- relay never updates a row, and retention's deletes must not be streamed.
-- A publication costs nothing while no slot reads it, so the polling relay's
-- deployments carry it unused. Created here, by the migrating (owner) role,
-- because CREATE PUBLICATION ... FOR TABLE needs the table's owner; the
-- relay's replication role only reads it.
CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert');

-- One row per replication slot a CDCRelay has used, written by the relay.
-- It is how a relay tells a lost slot from a first start: a slot named here
-- that is missing (dropped) or invalidated (wal_status 'lost') was lost, and
-- confirmed_at bounds the window whose events may never have been published.
-- confirmed_id is the highest outbox_events id acknowledged by Kafka and
-- confirmed to the slot; retention deletes rows up to it.
CREATE TABLE outbox_cdc_slots (
    slot_name     text        PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    confirmed_lsn pg_lsn      NOT NULL,
    confirmed_at  timestamptz NOT NULL DEFAULT now(),
    confirmed_id  bigint      NOT NULL DEFAULT 0
);
