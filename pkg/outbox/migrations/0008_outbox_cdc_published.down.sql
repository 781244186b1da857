ALTER TABLE outbox_cdc_slots
    DROP COLUMN IF EXISTS horizon_xmin,
    DROP COLUMN IF EXISTS horizon_lsn,
    DROP COLUMN IF EXISTS published_xmin;
