ALTER TABLE outbox_cdc_slots DROP COLUMN IF EXISTS gap_pending;
