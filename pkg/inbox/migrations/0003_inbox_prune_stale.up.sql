-- Retention prunes stale rows too (events skipped by the version guard):
-- they are dedupe records like processed ones, and would otherwise pile up.
CREATE INDEX inbox_messages_prunable_idx ON inbox_messages (processed_at)
    WHERE status IN ('processed', 'stale');
DROP INDEX IF EXISTS inbox_messages_processed_at_idx;
