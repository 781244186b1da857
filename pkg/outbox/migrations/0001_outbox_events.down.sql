DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;
DROP FUNCTION IF EXISTS outbox_events_notify();
DROP TABLE IF EXISTS outbox_events;
