CREATE INDEX IF NOT EXISTS inbox_messages_processed_at_idx ON inbox_messages (processed_at) WHERE status = 'processed';
DROP INDEX IF EXISTS inbox_messages_prunable_idx;
