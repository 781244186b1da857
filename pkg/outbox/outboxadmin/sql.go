package outboxadmin

import (
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
)

// Every statement of the operator functions, in one place: listing and
// requeuing dead events (dead.go) and replaying published ones
// (replay.go), in each relay mode. Pruning's are internal/pruning's
// (sql.go), shared with outbox.NewPruner; the backlog's and the lookup's
// are beside them (backlog.go, lookup.go).

const listDead = `
SELECT id, event_id, event_type, aggregate_type, aggregate_id, aggregate_version,
       attempts, coalesce(last_error, ''), created_at
FROM outbox_events
WHERE state = 'dead'
ORDER BY id
LIMIT $1`

// requeueSet gives a dead row a fresh budget of attempts, due at once. The
// cause of death stays in last_error, prefixed with "requeued: ", so a
// pending row with attempts = 0 and a last_error reads as a requeued one;
// the relay overwrites it on the next failure and clears it on success.
const requeueSet = `
UPDATE outbox_events
SET state = 'pending', attempts = 0, next_attempt_at = '-infinity',
    last_error = ` + requeuedError

// requeueWanted opens the statements that requeue dead rows by id ($1):
// wanted is the ids asked for, unknown those that name no row at all. The
// statement then changes nothing (deadWanted) and reports the unknown ids
// (requeueReport), so that a mistyped id is reported rather than quietly
// skipped. Rows that exist but are not dead are skipped, so a requeue can
// be repeated safely.
const requeueWanted = `
WITH wanted AS (SELECT DISTINCT unnest($1::bigint[]) AS id),
unknown AS (
    SELECT w.id FROM wanted w WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = w.id)),`

// deadWanted picks the dead rows among wanted, none if an id is unknown.
const deadWanted = `
    WHERE id IN (SELECT id FROM wanted) AND state = 'dead' AND NOT EXISTS (SELECT 1 FROM unknown)`

// requeueReport is what a requeue by id returns: how many rows the CTE
// requeued holds, and the unknown ids.
const requeueReport = `
SELECT (SELECT count(*) FROM requeued), coalesce((SELECT array_agg(id ORDER BY id) FROM unknown), '{}')`

// requeueIDs requeues the dead rows among the ids (requeueWanted).
const requeueIDs = requeueWanted + `
requeued AS (` + requeueSet + deadWanted + `
    RETURNING id)` + requeueReport

// chosenDead picks the dead rows a requeue by filter moves ($1 aggregate
// type, $2 aggregate id, ” for any; $3 the limit, NULL for none) in a
// MATERIALIZED CTE, run exactly once: as a subquery in the WHERE clause, a
// LIMIT … FOR UPDATE may be re-run for each row the UPDATE visits, skip the
// rows this statement already updated, and so requeue more than the limit.
const chosenDead = `
WITH chosen AS MATERIALIZED (
    SELECT id FROM outbox_events
    WHERE state = 'dead'
      AND ($1 = '' OR aggregate_type = $1)
      AND ($2 = '' OR aggregate_id = $2)
    ORDER BY created_at, aggregate_version, id
    LIMIT $3 -- NULL: no limit
    FOR UPDATE)`

// requeueDead requeues the dead rows chosenDead picks.
const requeueDead = chosenDead + requeueSet + `
WHERE id IN (SELECT id FROM chosen) AND state = 'dead'`

// replayWindow is shared by every mode's count, dry run and replay, so that
// they can never disagree about which rows are in scope; each mode's scope
// adds which states count as published.
const replayWindow = `
  AND aggregate_type = $1
  AND ($2 = '' OR aggregate_id = $2)
  AND created_at >= coalesce($3::timestamptz, '-infinity')
  AND created_at < coalesce($4::timestamptz, now())`

// replayScope is the polling relay's: it marks what it published.
const replayScope = `
WHERE state = 'published'` + replayWindow

const replayItems = `id, event_id, event_type, aggregate_id, aggregate_version, created_at`

// replayCount counts a mode's replay scope (a WHERE clause over
// replayWindow's parameters), and replayList lists it, in the order the
// relay will publish it (a dry run).
func replayCount(scope string) string { return `SELECT count(*) FROM outbox_events` + scope }
func replayList(scope string) string {
	return `SELECT ` + replayItems + ` FROM outbox_events` + scope + ` ORDER BY id`
}

// replayApply makes the relay publish the rows again. The event ids are
// kept: that is what lets every consumer's inbox recognise the replayed
// events as duplicates, so only consumers that never saw them act on them.
const replayApply = `
UPDATE outbox_events
SET state = 'pending', attempts = 0, next_attempt_at = '-infinity', published_at = NULL` +
	replayScope + `
RETURNING ` + replayItems

// copyColumns are the columns a row written again keeps; the rest (id,
// state, attempts, next_attempt_at, last_error, published_at) start over.
// created_at is kept so that the event stays in the replay windows and
// retention of its first write.
const copyColumns = `event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
    payload, headers, correlation_id, causation_id, traceparent, occurred_at, created_at, partition`

// copyAsPending inserts the rows of the CTE "moved" again as pending, each
// aggregate's in version order (identity values are drawn in the order the
// rows come, and the stream publishes in that order), with lastError as
// their last_error. Not in their old id order: a copy requeued before has a
// higher id than the successors it must precede.
func copyAsPending(lastError string) string {
	return `
INSERT INTO outbox_events (` + copyColumns + `, state, attempts, next_attempt_at, last_error)
SELECT ` + copyColumns + `, 'pending', 0, '-infinity', ` + lastError + `
FROM moved ORDER BY aggregate_version, id`
}

// requeuedError is requeueSet's last_error: the cause of death, prefixed.
const requeuedError = `'requeued: ' || coalesce(last_error, '')`

// requeueCopyIDsSQL is requeueIDs for outbox.ModeCDC: the same refusal of unknown
// ids, then each dead row deleted and inserted again.
var requeueCopyIDsSQL = requeueWanted + `
moved AS (
    DELETE FROM outbox_events` + deadWanted + `
    RETURNING *),
requeued AS (` + copyAsPending(requeuedError) + `
    RETURNING id)` + requeueReport

// requeueCopyDead is requeueDead for outbox.ModeCDC.
var requeueCopyDead = chosenDead + `,
moved AS (
    DELETE FROM outbox_events WHERE id IN (SELECT id FROM chosen) AND state = 'dead'
    RETURNING *)` + copyAsPending(requeuedError)

// replayScopeCDC: a log-based relay never marks a row published; what it
// published is what its slot confirmed, commit-ordered (publishedCDC, the
// test retention and Backlog use: never the highest confirmed id, which a
// row committed late lies below before anyone published it). Rows marked
// published are those of a polling relay this outbox ran before.
var replayScopeCDC = `
WHERE (state = 'published'
       OR (state = 'pending' AND ` + lifecycle.PublishedCDC("outbox_events") + `))` + replayWindow

// replayApplyCDC writes every row in scope again, as requeueCopyDead does.
var replayApplyCDC = `
WITH moved AS (
    DELETE FROM outbox_events` + replayScopeCDC + `
    RETURNING *)` + copyAsPending("NULL") + `
RETURNING ` + replayItems

// replayScopeExternal: an external publisher (outbox.ModeDebezium) marks no row
// published, so every row of the window that is not dead is in scope.
const replayScopeExternal = `
WHERE state IN ('pending', 'published')` + replayWindow

// replayApplyExternal writes every row in scope again, as replayApplyCDC.
var replayApplyExternal = `
WITH moved AS (
    DELETE FROM outbox_events` + replayScopeExternal + `
    RETURNING *)` + copyAsPending("NULL") + `
RETURNING ` + replayItems

// emitColumns are what Emit needs of a row.
const emitColumns = `id, event_id, event_type, event_version, aggregate_type, aggregate_id, aggregate_version,
       payload, headers, occurred_at`

const selectDeadIDs = `
SELECT ` + emitColumns + ` FROM outbox_events
WHERE id = ANY($1::bigint[]) AND state = 'dead'
ORDER BY aggregate_version, id
FOR UPDATE`

const selectDeadFiltered = `
SELECT ` + emitColumns + ` FROM outbox_events
WHERE state = 'dead'
  AND ($1 = '' OR aggregate_type = $1)
  AND ($2 = '' OR aggregate_id = $2)
ORDER BY created_at, aggregate_version, id
LIMIT $3 -- NULL: no limit
FOR UPDATE`

const unknownIDs = `
SELECT coalesce(array_agg(w.id ORDER BY w.id), '{}')
FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) w
WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = w.id)`

const deleteIDs = `DELETE FROM outbox_events WHERE id = ANY($1::bigint[])`
