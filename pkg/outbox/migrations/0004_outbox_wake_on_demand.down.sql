DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;

CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();

ALTER TABLE outbox_relays DROP COLUMN IF EXISTS waiting;
