DROP INDEX IF EXISTS inbox_messages_dead_lettered_idx;
