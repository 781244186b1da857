DROP TABLE IF EXISTS outbox_cdc_slots;
DROP PUBLICATION IF EXISTS outbox_events_pub;
