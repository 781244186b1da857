package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
)

// The operator actions of every relay mode (invariant 8: they work, or they
// refuse with ErrNotInThisMode; none reports a success that will not
// happen).
//
// The polling relay reads the table, so setting a row back to pending is
// enough. A log-based relay reads only inserts from the replication stream
// (publication outbox_events_pub is insert-only, so that retention's
// deletes are not streamed): a row set back to pending is never streamed
// again, and its retention deletes it. So in those modes an action writes
// the event again under its own event id — consumers dedupe on it:
//
//   - ModeCDC: the row is deleted and inserted again, in one statement, as a
//     new pending row (a new id, everything else kept), which the stream
//     carries like any insert. Deleting first is what lets the copy keep
//     the event id that outbox_events holds unique.
//   - ModeWAL: a dead row (one the table still holds, from a time this
//     outbox ran in another mode) is emitted into the WAL (Emit) and
//     deleted, in one transaction. The WAL-only relay itself keeps no copy
//     of what it publishes or skips: a replay has nothing to replay from,
//     and a requeue that finds no dead row says so, with ErrNotInThisMode.
//   - ModeDebezium: as ModeCDC, since Debezium too streams the inserts of
//     outbox_events_pub. But Debezium marks no row dead (a record Kafka
//     refuses fails the connector's task, which Connect reports), so a
//     requeue that finds no dead row says so, with ErrNotInThisMode; and it
//     marks no row published, so a replay's scope is every row of the
//     window that is not dead (see RelayMode.Replay).

// Requeue is what the package-level Requeue does, for a service whose relay
// runs in mode m. In ModeCDC and ModeWAL a requeued row leaves under its id
// (see above), so a repeated call naming the same ids is refused with
// ErrNotFound instead of counting 0; in ModeWAL a call that finds no dead
// row is refused with ErrNotInThisMode.
func (m RelayMode) Requeue(ctx context.Context, db DB, ids ...int64) (int, error) {
	switch m {
	case ModePoll:
		return requeuePoll(ctx, db, ids)
	case ModeCDC, ModeDebezium:
		return requeueCopyIDs(ctx, db, ids)
	case ModeWAL:
		return requeueEmitIDs(ctx, db, ids)
	}
	return 0, errUnknownMode(m)
}

// RequeueDead is what the package-level RequeueDead does, for a service
// whose relay runs in mode m; see RelayMode.Requeue for how each mode
// writes the event again.
func (m RelayMode) RequeueDead(ctx context.Context, db DB, f DeadFilter) (int, error) {
	var limit any // nil: LIMIT NULL, no limit
	if f.Limit > 0 {
		limit = f.Limit
	}
	switch m {
	case ModePoll:
		return requeueDeadPoll(ctx, db, f)
	case ModeCDC, ModeDebezium:
		tag, err := db.Exec(ctx, requeueCopyDead, f.AggregateType, f.AggregateID, limit)
		if err != nil {
			return 0, storeErr("requeuing dead events", err)
		}
		if n := int(tag.RowsAffected()); n > 0 || m == ModeCDC {
			return n, nil
		}
		return 0, fmt.Errorf("%w: RELAY_MODE=debezium keeps no dead events: Debezium never marks an outbox row dead "+
			"(a record Kafka refuses fails the connector's task: see the task's status and trace in Kafka Connect, "+
			"GET /connectors/<name>/status), so there is nothing to requeue; dead rows here only come from a time this "+
			"outbox ran another relay mode", ErrNotInThisMode)
	case ModeWAL:
		return requeueEmitDead(ctx, db, f.AggregateType, f.AggregateID, limit)
	}
	return 0, errUnknownMode(m)
}

// Replay is what the package-level Replay does, for a service whose relay
// runs in mode m. In ModeCDC the scope is the rows still in the table whose
// position the relay confirmed (CDCConfig.Retain keeps them, one minute by
// default: set it to the window you may need to replay), each written
// again as a new row; the items returned name the new rows. In
// ModeDebezium the table cannot tell what Debezium has published, so the
// scope is every row of the window that is not dead (PruneConfig.
// PendingRetention keeps them), each written again as a new row: one that
// Debezium had not published yet is then published twice, which the
// consumers' inboxes absorb. That is also how to republish the window of a
// slot that was lost. In ModeWAL it is refused with ErrNotInThisMode.
func (m RelayMode) Replay(ctx context.Context, db DB, f ReplayFilter, dryRun bool) ([]ReplayItem, error) {
	switch m {
	case ModePoll:
		return replay(ctx, db, f, dryRun, replayScope, replayApply)
	case ModeCDC:
		return replay(ctx, db, f, dryRun, replayScopeCDC, replayApplyCDC)
	case ModeDebezium:
		return replay(ctx, db, f, dryRun, replayScopeExternal, replayApplyExternal)
	case ModeWAL:
		if err := f.validate(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: RELAY_MODE=wal writes events only to the WAL and keeps no copy of what it published, "+
			"so there is nothing to replay from; replay from the Kafka topic itself, or write the events again from the domain data", ErrNotInThisMode)
	}
	return nil, errUnknownMode(m)
}

func errUnknownMode(m RelayMode) error {
	return fmt.Errorf("outbox: unknown relay mode %q (poll, cdc, wal or debezium)", m)
}

// copyColumns are the columns a row written again keeps; the rest (id,
// state, attempts, next_attempt_at, last_error, published_at) start over.
// created_at is kept so that the event stays in the replay windows and
// retention of its first write.
const copyColumns = `event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
    payload, headers, correlation_id, causation_id, traceparent, occurred_at, created_at, partition`

// copyAsPending inserts the rows of the CTE "moved" again as pending, in
// their old order (identity values are drawn in the order the rows come),
// with lastError as their last_error.
func copyAsPending(lastError string) string {
	return `
INSERT INTO outbox_events (` + copyColumns + `, state, attempts, next_attempt_at, last_error)
SELECT ` + copyColumns + `, 'pending', 0, '-infinity', ` + lastError + `
FROM moved ORDER BY id`
}

// requeuedError is requeueSet's last_error: the cause of death, prefixed.
const requeuedError = `'requeued: ' || coalesce(last_error, '')`

// requeueCopyIDsSQL is requeueIDs for ModeCDC: the same refusal of unknown
// ids, then each dead row deleted and inserted again.
var requeueCopyIDsSQL = `
WITH wanted AS (SELECT DISTINCT unnest($1::bigint[]) AS id),
unknown AS (
    SELECT w.id FROM wanted w WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = w.id)),
moved AS (
    DELETE FROM outbox_events
    WHERE id IN (SELECT id FROM wanted) AND state = 'dead' AND NOT EXISTS (SELECT 1 FROM unknown)
    RETURNING *),
copied AS (` + copyAsPending(requeuedError) + `
    RETURNING id)
SELECT (SELECT count(*) FROM copied), coalesce((SELECT array_agg(id ORDER BY id) FROM unknown), '{}')`

// requeueCopyDead is requeueDead for ModeCDC.
var requeueCopyDead = `
WITH chosen AS MATERIALIZED (
    SELECT id FROM outbox_events
    WHERE state = 'dead'
      AND ($1 = '' OR aggregate_type = $1)
      AND ($2 = '' OR aggregate_id = $2)
    ORDER BY id
    LIMIT $3 -- NULL: no limit
    FOR UPDATE),
moved AS (
    DELETE FROM outbox_events WHERE id IN (SELECT id FROM chosen)
    RETURNING *)` + copyAsPending(requeuedError)

func requeueCopyIDs(ctx context.Context, db DB, ids []int64) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var (
		n       int
		unknown []int64
	)
	rows, err := db.Query(ctx, requeueCopyIDsSQL, ids)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&n, &unknown}, func() error { return nil })
	}
	if err != nil {
		return 0, storeErr(fmt.Sprintf("requeuing %d ids", len(ids)), err)
	}
	if len(unknown) > 0 {
		return 0, fmt.Errorf("%w: no outbox row has id %s (nothing was requeued; a requeued or replayed row "+
			"was written again under a new id, and pruned rows are gone)", ErrNotFound, listIDs(unknown))
	}
	return n, nil
}

// replayScopeCDC: a log-based relay never marks a row published; what it
// published is what its slot confirmed (outbox_cdc_slots.confirmed_id, the
// highest id Kafka acknowledged). Rows marked published are those of a
// polling relay this outbox ran before.
const replayScopeCDC = `
WHERE (state = 'published'
       OR (state = 'pending' AND id <= (SELECT coalesce(max(confirmed_id), 0) FROM outbox_cdc_slots)))` + replayWindow

// replayApplyCDC writes every row in scope again, as requeueCopyDead does.
var replayApplyCDC = `
WITH moved AS (
    DELETE FROM outbox_events` + replayScopeCDC + `
    RETURNING *)` + copyAsPending("NULL") + `
RETURNING ` + replayItems

// replayScopeExternal: an external publisher (ModeDebezium) marks no row
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
ORDER BY id
FOR UPDATE`

const selectDeadFiltered = `
SELECT ` + emitColumns + ` FROM outbox_events
WHERE state = 'dead'
  AND ($1 = '' OR aggregate_type = $1)
  AND ($2 = '' OR aggregate_id = $2)
ORDER BY id
LIMIT $3 -- NULL: no limit
FOR UPDATE`

const unknownIDs = `
SELECT coalesce(array_agg(w.id ORDER BY w.id), '{}')
FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) w
WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = w.id)`

const deleteIDs = `DELETE FROM outbox_events WHERE id = ANY($1::bigint[])`

// requeueEmitIDs is requeueIDs for ModeWAL: the same refusal of unknown
// ids, then each dead row among them emitted and deleted.
func requeueEmitIDs(ctx context.Context, db DB, ids []int64) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return inTx(ctx, db, func(tx pgx.Tx) (int, error) {
		var unknown []int64
		if err := tx.QueryRow(ctx, unknownIDs, ids).Scan(&unknown); err != nil {
			return 0, storeErr("looking up ids to requeue", err)
		}
		if len(unknown) > 0 {
			return 0, fmt.Errorf("%w: no outbox row has id %s (nothing was requeued; a requeued row was emitted "+
				"into the WAL and left the table, and pruned rows are gone)", ErrNotFound, listIDs(unknown))
		}
		return emitDead(ctx, tx, selectDeadIDs, ids)
	})
}

// requeueEmitDead is requeueDead for ModeWAL; finding nothing to requeue is
// refused, since the WAL-only relay never leaves a dead row behind.
func requeueEmitDead(ctx context.Context, db DB, aggType, aggID string, limit any) (int, error) {
	return inTx(ctx, db, func(tx pgx.Tx) (int, error) {
		n, err := emitDead(ctx, tx, selectDeadFiltered, aggType, aggID, limit)
		if err == nil && n == 0 {
			err = fmt.Errorf("%w: RELAY_MODE=wal keeps no dead events: an event Kafka refused is logged with its event id "+
				"and counted in outbox_dead_total, not stored, so there is nothing to requeue; write it again from the domain data",
				ErrNotInThisMode)
		}
		return n, err
	})
}

// inTx runs f in a transaction of db and commits it if f succeeds.
func inTx(ctx context.Context, db DB, f func(pgx.Tx) (int, error)) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, storeErr("beginning requeue", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	n, err := f(tx)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, storeErr("committing requeue", err)
	}
	return n, nil
}

// emitDead emits the dead rows query selects into the WAL, in id order, and
// deletes them: the WAL-only relay publishes them at tx's commit.
func emitDead(ctx context.Context, tx pgx.Tx, query string, args ...any) (int, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return 0, storeErr("reading dead events", err)
	}
	type deadRow struct {
		id      int64
		ev      event.Envelope
		headers []byte
	}
	dead, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (deadRow, error) {
		var (
			d       deadRow
			payload []byte
		)
		err := row.Scan(&d.id, &d.ev.EventID, &d.ev.EventType, &d.ev.EventVersion, &d.ev.AggregateType,
			&d.ev.AggregateID, &d.ev.AggregateVersion, &payload, &d.headers, &d.ev.OccurredAt)
		d.ev.Payload = payload
		return d, err
	})
	if err != nil {
		return 0, storeErr("reading dead events", err)
	}
	ids := make([]int64, len(dead))
	for i, d := range dead {
		var h envelopeHeaders
		if err := json.Unmarshal(d.headers, &h); err != nil {
			return 0, fmt.Errorf("outbox: requeuing row %d: %w: headers: %w", d.id, ErrUndecodable, err)
		}
		d.ev.CorrelationID, d.ev.CausationID, d.ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		if err := Emit(ctx, tx, d.ev); err != nil {
			return 0, storeErr(fmt.Sprintf("emitting row %d", d.id), err)
		}
		ids[i] = d.id
	}
	if _, err := tx.Exec(ctx, deleteIDs, ids); err != nil {
		return 0, storeErr("deleting emitted rows", err)
	}
	return len(dead), nil
}
