DROP TABLE IF EXISTS inbox_parked_messages;
DROP TABLE IF EXISTS inbox_dead_keys;
