-- What the log-based relay published, commit-ordered (issue 30). It never
-- marks a row, and confirmed_id (the highest id of the confirmed
-- transactions) cannot say it: ids are drawn at INSERT, not at commit, so a
-- transaction that inserted first and commits last has its row below
-- confirmed_id before anything published it, and retention deleted it.
--
-- The horizon is a snapshot's xmin and the WAL insert position read right
-- after that snapshot: every transaction older than the xmin had committed
-- before the snapshot, so its commit record lies below horizon_lsn. Once
-- the slot's confirmed position (confirmed_lsn) passes horizon_lsn, all of
-- them were decoded and acknowledged by Kafka, and horizon_xmin becomes
-- published_xmin: a pending row inserted by a transaction older than
-- published_xmin is published. Retention, the cdc replay's scope and
-- Backlog share that test (publishedCDC in pkg/outbox). A new slot resets
-- the horizon (markGap); the gap replay sets published_xmin itself.
ALTER TABLE outbox_cdc_slots
    ADD COLUMN horizon_xmin   xid,
    ADD COLUMN horizon_lsn    pg_lsn,
    ADD COLUMN published_xmin xid;
