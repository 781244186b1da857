-- The log-based relay (CDCRelay) reads outbox_events inserts from a logical
-- replication slot through the publication outbox_events_pub (pgoutput).
-- Only inserts: the relay never updates a row, and retention's deletes must
-- not be streamed. A publication costs nothing while no slot reads it, so
-- the polling relay's deployments can carry it unused.
--
-- CREATE PUBLICATION needs CREATE on the database. A least-privilege owner
-- role (platform/pgroles) may not have it: then the migration leaves
-- the publication out, and a CDCRelay creates it at start over its
-- replication connection (a superuser, or a role that owns the table), or
-- says what to grant. The polling relay needs none of it.
DO $$
BEGIN
    IF has_database_privilege(current_database(), 'CREATE') THEN
        CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert');
    ELSE
        RAISE NOTICE 'outbox: no CREATE on database %: publication outbox_events_pub left to the log-based relay', current_database();
    END IF;
END $$;

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
