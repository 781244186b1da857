DROP INDEX IF EXISTS outbox_events_blocking_idx;
DROP TABLE IF EXISTS outbox_relays;
