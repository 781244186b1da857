-- inbox_dead_letters counts each consumer's dead_lettered rows every few
-- seconds; this keeps that count off the processed rows, however many.
CREATE INDEX inbox_messages_dead_lettered_idx ON inbox_messages (consumer) WHERE status = 'dead_lettered';
