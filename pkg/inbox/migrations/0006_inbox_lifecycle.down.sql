DROP TABLE IF EXISTS inbox_operator_actions;
DROP TABLE IF EXISTS inbox_dead_letter_originals;
ALTER TABLE inbox_messages DROP COLUMN IF EXISTS may_have_called;
ALTER TABLE inbox_messages DROP COLUMN IF EXISTS aggregate_type;
