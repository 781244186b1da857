package cdc

import (
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
)

// Every statement the log-based relay runs, in one place: the slot and the
// publication (slot.go), the stream's start (stream.go), the gap of
// a lost slot (gap.go), the lanes' checks and dead marks (lane.go),
// and the gauges and retention beside the stream (upkeep.go).

// deleteConfirmedBatch removes rows Kafka acknowledged and the slot
// confirmed (lifecycle.PublishedCDC). Only state 'pending': a row marked dead (its
// event was skipped) stays for the operator. Nothing while a new slot's gap
// has not been republished from the table.
var deleteConfirmedBatch = `
DELETE FROM outbox_events WHERE id IN (
    SELECT o.id FROM outbox_events o JOIN outbox_cdc_slots s ON s.slot_name = $1 AND NOT s.gap_pending
    WHERE o.state = 'pending' AND o.id <= s.confirmed_id AND age(o.xmin) > age(s.published_xmin)
      AND o.created_at < now() - $2 * interval '1 microsecond'
    ORDER BY o.id LIMIT $3)`

// advanceHorizon is retention's first step (internal/lifecycle, "horizon,
// published"): a pending horizon the slot's recorded position passed
// becomes published_xmin, and a new horizon is taken: $2, read just before
// by horizonXid, and the WAL insert position now, in a later statement, so
// every transaction of this database older than $2 committed below it. A
// horizon not passed yet stays, so that a busy outbox still promotes one.
// Not while a new slot's gap is pending: the new slot's positions say
// nothing about what the old one published.
const advanceHorizon = `
UPDATE outbox_cdc_slots SET
    published_xmin = CASE WHEN horizon_lsn <= confirmed_lsn THEN horizon_xmin ELSE published_xmin END,
    horizon_xmin   = CASE WHEN horizon_lsn IS NULL OR horizon_lsn <= confirmed_lsn
                          THEN $2::text::xid ELSE horizon_xmin END,
    horizon_lsn    = CASE WHEN horizon_lsn IS NULL OR horizon_lsn <= confirmed_lsn
                          THEN pg_current_wal_insert_lsn() ELSE horizon_lsn END
WHERE slot_name = $1 AND NOT gap_pending`

const publicationExists = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`

// createPublication is migration 0005's publication, for when the
// migrating role could not create it.
const createPublication = `CREATE PUBLICATION ` + Publication + ` FOR TABLE outbox_events WITH (publish = 'insert')`

// slotState is the slot's row in pg_replication_slots (its wal_status, and
// whether it is still being created: no confirmed position yet) and the
// relay's own record of it (outbox_cdc_slots). A record whose position is 0/0 was
// marked (markGap) for a slot that was never created: a first start.
const slotState = `
SELECT (SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()),
       (SELECT confirmed_flush_lsn IS NULL FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()),
       (SELECT nullif(confirmed_lsn, '0/0')::text FROM outbox_cdc_slots WHERE slot_name = $1),
       (SELECT confirmed_at FROM outbox_cdc_slots WHERE slot_name = $1)`

// markGap is written before a slot is created (or an invalidated one
// dropped): a new slot streams from its creation only, so the rows
// committed before it and never published (a lost slot's gap, or rows left
// by the polling relay) are in no stream. gap_pending makes whichever relay
// streams the new slot republish the table's pending rows first, and keeps
// retention off until it did (migration 0006). It must be there before the
// slot exists: another relay may take the slot the moment it is created,
// while its creator is still frozen between two lines. created_at tells one
// mark from the next (gapReplayed). A first mark's position is 0/0: no slot
// confirmed anything yet.
//
// It overwrites whatever state the record is in, on purpose: its expected
// state is the slot's (missing or lost in pg_replication_slots), and a late
// mark (a creator frozen since it read that) only makes the slot's holder
// replay the gap once more (gapReplayed refuses the older generation): a
// duplicate, never a loss. The pending horizon goes: it was taken against
// the old slot's positions.
const markGap = `
INSERT INTO outbox_cdc_slots (slot_name, created_at, confirmed_lsn, confirmed_at, confirmed_id, gap_pending)
VALUES ($1, clock_timestamp(), '0/0', now(), 0, true)
ON CONFLICT (slot_name) DO UPDATE SET created_at = clock_timestamp(), gap_pending = true,
    horizon_xmin = NULL, horizon_lsn = NULL`

// recordSlot records where a new slot starts, once it exists, so that
// losing it is noticed even before a relay confirmed anything on it. The
// slot's holder may have recorded a later position already.
const recordSlot = `
UPDATE outbox_cdc_slots SET confirmed_lsn = greatest(confirmed_lsn, $2::pg_lsn), confirmed_at = now()
WHERE slot_name = $1`

// recordHandMadeSlot records a slot the relay did not create; what was
// committed before it is unknown, so its gap is replayed too.
const recordHandMadeSlot = `
INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn, gap_pending)
SELECT slot_name, confirmed_flush_lsn, true FROM pg_replication_slots WHERE slot_name = $1
ON CONFLICT DO NOTHING`

// recordConfirmed records the stream's confirmed position (internal/lifecycle),
// for the slot generation the stream started on ($4, the record's
// created_at then): a stream of a slot since lost and replaced must not
// move the new one's record (it would promote a horizon the new slot has
// not confirmed).
const recordConfirmed = `
UPDATE outbox_cdc_slots SET confirmed_lsn = $2::pg_lsn, confirmed_at = now(), confirmed_id = greatest(confirmed_id, $3)
WHERE slot_name = $1 AND created_at = $4`

// slotConsistent is whether the slot exists, and whether it is consistent
// (its creator has its confirmed position: NULL until every transaction
// running at its creation ended).
const slotConsistent = `
SELECT count(*) > 0, coalesce(bool_and(confirmed_flush_lsn IS NOT NULL), false)
FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`

// slotConfirmed is where the slot's stream resumes; read while this relay
// holds the slot, so nobody moves it meanwhile.
const slotConfirmed = `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`

// gapPending is whether the slot's gap is still to be republished, and the
// mark that said so.
const gapPending = `SELECT gap_pending, created_at FROM outbox_cdc_slots WHERE slot_name = $1`

// gapRows reads the gap, a page at a time in id order (keyset on id, so
// each page is one index range scan of the pending index): the pending rows
// no slot confirmed. A row the old slot confirmed (lifecycle.PublishedCDC) is left
// out: markGap keeps published_xmin and confirmed_id, which only ever say
// what Kafka acknowledged, so a lost slot (a PostgreSQL 15 failover) costs
// the gap, not every row retention kept. After an asynchronous failover
// the record may be older than the old primary's last one: the replay is
// then larger, never short.
var gapRows = `
SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
       payload, headers, occurred_at, created_at
FROM outbox_events WHERE state = 'pending' AND id > $1 AND NOT ` + lifecycle.PublishedCDC("outbox_events") + `
ORDER BY id LIMIT $2`

// gapReplayed ends the replay: retention may delete again, and the rows it
// republished count as confirmed. Only if the mark it replayed for is still
// the last one ($3, its created_at): a slot lost and marked again during the
// replay has a gap of its own, which the replay may have read too early.
//
// Every row of a transaction older than the horizon read before the
// replay's first page ($4, horizonXid) committed before the replay read
// the table, so the replay published it (or it is dead): that is the new
// published_xmin.
const gapReplayed = `
UPDATE outbox_cdc_slots SET gap_pending = false, confirmed_id = greatest(confirmed_id, $2),
    published_xmin = $4::text::xid, horizon_xmin = NULL, horizon_lsn = NULL
WHERE slot_name = $1 AND gap_pending AND created_at = $3`

// horizonXid is an xid every transaction of this database older than it
// has ended by the time the statement returns: the oldest of the
// transactions running in this database (pg_stat_activity, which shows
// every role's backend_xid, and the prepared ones) and the statement
// snapshot's xmax. Not the snapshot's xmin, which is the oldest running
// anywhere in the cluster: a transaction open in another service's or
// test's database (they share one Postgres) held retention, Backlog and the
// gap replay's published_xmin back in every other. Only this database's
// transactions can insert into its outbox_events; their subtransactions'
// xids are younger than their own.
//
// Why it holds: a transaction older than the snapshot's xmax had its xid
// when the statement's snapshot was taken (before anything here runs), so
// when pg_stat_activity is read it has either ended or is listed, and then
// the answer is not younger than it. Read as its own statement (a
// transaction of its own: pg_stat_activity is read once per transaction),
// and the WAL position that goes with it after it (advanceHorizon). age()
// orders xids across wraparound.
const horizonXid = `
SELECT x::text FROM (
    SELECT pg_snapshot_xmax(pg_current_snapshot())::xid AS x
    UNION ALL SELECT backend_xid FROM pg_stat_activity WHERE datname = current_database() AND backend_xid IS NOT NULL
    UNION ALL SELECT transaction FROM pg_prepared_xacts WHERE database = current_database()
) r ORDER BY age(x) DESC LIMIT 1`

const (
	// firstDeadRows is, per aggregate with a dead row, the event id and
	// version of its dead row of the lowest aggregate version: the hold
	// (lane.deadAhead). By version, not id: a requeued copy has a new id.
	firstDeadRows = `
SELECT DISTINCT ON (aggregate_type, aggregate_id) aggregate_type, aggregate_id, event_id::text, aggregate_version
FROM outbox_events WHERE state = 'dead' ORDER BY aggregate_type, aggregate_id, aggregate_version, id`
	// firstDeadRowOf is the same for one aggregate.
	firstDeadRowOf = `
SELECT event_id::text, aggregate_version FROM outbox_events
WHERE state = 'dead' AND aggregate_type = $1 AND aggregate_id = $2 ORDER BY aggregate_version, id LIMIT 1`
)

// settledRows is which of the given rows (outbox id, event id) are settled
// already: marked dead, or requeued (deleted and written again, in the same
// statement, under a new id with the same event id). A row that is not
// there at all is not settled: the stream can deliver a commit a moment
// before other sessions see it, and a row retention deleted was published
// (publishing it again is a duplicate consumers absorb, never a loss).
const settledRows = `
SELECT x.id FROM unnest($1::bigint[], $2::uuid[]) AS x(id, event_id)
WHERE EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = x.id AND o.state = 'dead')
   OR EXISTS (SELECT 1 FROM outbox_events o WHERE o.event_id = x.event_id AND o.id <> x.id)`

// markDeadCDC is the log-based relay's pending → dead (internal/lifecycle): a row
// no longer pending (dead already, or requeued and so deleted) is left as
// it is.
const markDeadCDC = `UPDATE outbox_events SET state = 'dead', last_error = $2, attempts = $3 WHERE id = $1 AND state = 'pending'`

// rowAfterRefusedMark is why markDeadCDC changed nothing: the row's state
// (NULL: not there), whether a requeued copy carries its event (the same
// event id under another id), and whether its transaction ($3, an xid; 0:
// unknown) still runs, committed but not yet visible to other sessions.
// pg_stat_activity shows every role's backend_xid (horizonXid).
const rowAfterRefusedMark = `
SELECT (SELECT state FROM outbox_events WHERE id = $1),
       EXISTS (SELECT 1 FROM outbox_events WHERE event_id = $2 AND id <> $1),
       $3::bigint <> 0 AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_xid = $3::bigint::text::xid)`

// currentWAL is the server's current WAL position.
const currentWAL = `SELECT pg_current_wal_lsn()::text`
