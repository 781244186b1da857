DROP INDEX IF EXISTS inbox_messages_uncertain_idx;
ALTER TABLE inbox_messages DROP COLUMN IF EXISTS lease_owner, DROP COLUMN IF EXISTS lease_until, DROP COLUMN IF EXISTS fencing_token;
DROP TABLE IF EXISTS inbox_aggregate_versions;
