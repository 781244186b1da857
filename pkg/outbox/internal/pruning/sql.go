package pruning

// The statements of Once (pruning.go).

// pruneStatement deletes (or, with archive, archives) one batch of the
// oldest rows matching doomed, a SELECT of ids whose $1 is the retention in
// microseconds and $2 the batch size. The rows are selected once
// (MATERIALIZED: as outboxadmin's requeueDead); SKIP LOCKED: a row someone is replaying
// right now is left for the next run instead of being waited for.
func pruneStatement(doomed string, archive bool) string {
	batch := `
WITH doomed AS MATERIALIZED (` + doomed + `
    FOR UPDATE SKIP LOCKED)`
	if !archive {
		return batch + `
DELETE FROM outbox_events WHERE id IN (SELECT id FROM doomed)`
	}
	// Deleted and archived in one statement, so a row is never in both
	// tables nor in neither. The column lists are explicit so that columns
	// added to outbox_events later do not break it.
	return batch + `,
moved AS (
    DELETE FROM outbox_events WHERE id IN (SELECT id FROM doomed)
    RETURNING id, event_id, aggregate_type, aggregate_id, aggregate_version,
              event_type, event_version, payload, headers, occurred_at, created_at,
              partition, state, attempts, next_attempt_at, last_error, published_at,
              correlation_id, causation_id, traceparent)
INSERT INTO outbox_events_archive (
    id, event_id, aggregate_type, aggregate_id, aggregate_version,
    event_type, event_version, payload, headers, occurred_at, created_at,
    partition, state, attempts, next_attempt_at, last_error, published_at,
    correlation_id, causation_id, traceparent)
SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version,
       event_type, event_version, payload, headers, occurred_at, created_at,
       partition, state, attempts, next_attempt_at, last_error, published_at,
       correlation_id, causation_id, traceparent
FROM moved`
}

// publishedDoomed are the published rows past retention, oldest publication
// first.
const publishedDoomed = `
    SELECT id FROM outbox_events
    WHERE state = 'published' AND published_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY published_at, id
    LIMIT $2`

// pendingDoomed are the pending rows created before PendingRetention, in id
// order (the pending index's), which is creation order.
const pendingDoomed = `
    SELECT id FROM outbox_events
    WHERE state = 'pending' AND created_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY id
    LIMIT $2`
