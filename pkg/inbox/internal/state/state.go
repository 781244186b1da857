// Package state is the inbox's lifecycle: the states of its rows, every
// transition between them and the one statement that takes each.
package state

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The inbox's lifecycle, written down once. This file holds the states of
// an inbox row (inbox_messages.status) and of the rows that hold an
// aggregate back (the version guard, inbox_dead_keys, the parking), every
// transition between them, who may take it, and the one statement that
// takes it: package state, shared by the engine (pkg/inbox/internal/engine)
// and lease mode (pkg/inbox/lease). No other file of the inbox writes these
// tables (a test, TestOnlyStateGoWritesTheLifecycleTables, keeps it so).
//
// Every transition is one statement that names the state it expects (and,
// under a lease, the fencing token): a writer whose right has lapsed — a
// late dead-letter write, a lease taken over, a second operator, a worker
// of a generation that ended — matches no row and changes nothing. A
// guarded transition that changes nothing is refused: counted in
// inbox_transitions_refused_total{transition} and logged (the engine's
// Shared.Refused). No
// INSERT … ON CONFLICT DO UPDATE here lacks a WHERE on the state it
// overwrites.
//
// docs/inbox.md draws the machine (Mermaid stateDiagram-v2); its
// transitions carry the names below.
//
//	(none) ─record──────────────► processed            worker (transactional)
//	(none) ─lease───────────────► leased(token 1)      worker (lease mode)
//	leased ─takeover────────────► leased(token+1)      worker, once the lease expired; may_have_called
//	(none) ─lease───────────────► leased, may_have_called   worker, for a message sent before a server switch
//	requeued ─reclaim───────────► leased(token+1)      worker; keeps may_have_called
//	requeued ─reapply───────────► processed            worker (transactional)
//	leased ─renew───────────────► leased               lease holder (token)
//	leased ─done────────────────► processed            lease holder (token)
//	leased ─uncertain───────────► uncertain            lease holder (token)
//	leased ─dead_letter_leased──► dead_lettered        lease holder (token); keeps may_have_called
//	(none)|requeued ─dead_letter► dead_lettered        worker holding no lease
//	processed|leased ─stale─────► stale                worker, in the transaction that recorded it
//	processed|leased ─unrecord──► (none), parked       worker, in the transaction that recorded it
//	processed|leased ─repark────► requeued, parked     worker, same transaction: a reapplied/reclaimed requeue
//	dead_lettered ─requeue──────► requeued             operator (RequeueDeadLetters)
//	dead_lettered|requeued ─skip► skipped              operator (SkipHeld), with a reason
//	(none) ─skip────────────────► skipped              operator (SkipHeld): a parked message
//	requeued ─release───────────► dead_lettered        operator (ReleaseHeld): the copy never came
//	processed|stale|skipped ─prune► (none)             pruner, after Retention
//
// The rows that hold an aggregate follow the dead message: a hold
// (inbox_dead_keys) is 'dead' with its dead letter, 'requeued' with its
// requeue, and gone once the requeued message is applied (drop_hold) or an
// operator released or skipped it; a parked message leaves the parking once
// it is settled (unpark) or skipped. The version guard only moves forward
// (advance), except back below a dead leased message (unreserve). A
// lease-mode consumer's server record (inbox_servers) is written when it is
// missing or names another server (server_switch).

// The states of an inbox row.
const (
	StatusLeased    = "leased"
	StatusProcessed = "processed"
	StatusStale     = "stale"
	StatusDead      = "dead_lettered"
	StatusRequeued  = "requeued"
	StatusUncertain = "uncertain"
	StatusSkipped   = "skipped"
)

// Who may take a transition.
const (
	ByWorker   = "worker"       // a worker of the consumer, settling a message it holds in its generation
	ByHolder   = "lease holder" // the worker whose fencing token the row carries
	ByOperator = "operator"     // RequeueDeadLetters, ReleaseHeld, SkipHeld
	ByPruner   = "pruner"       // Prune
)

// Transition is one edge of the machine: its name (the transition label of
// inbox_transitions_refused_total), the states it expects, the state it
// leaves, who may take it, and its statement.
type Transition struct {
	Name string
	From []string // "" is no row
	To   string   // "" is no row
	By   string
	SQL  string
}

// Transitions of inbox_messages. $1 is always the consumer, $2 the message.
var (
	// Record inserts a message's row as processed, in the transaction of
	// its handler; a requeued row becomes processed (reapply), which it
	// returns (xmax is set on the row an upsert updated): the requeued
	// event is applied whatever the version guard says. Any other row makes
	// it a duplicate (no row returned, not a refusal). A reapply also
	// returns the requeued row as it was (the subquery reads the
	// statement's snapshot, before the update), for Repark.
	Record = Transition{Name: "record", From: []string{"", StatusRequeued}, To: StatusProcessed, By: ByWorker, SQL: `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'processed', sha256($10), now())
ON CONFLICT (consumer, message_id) DO UPDATE
SET status = 'processed', processed_at = now(), last_error = NULL, attempts = inbox_messages.attempts + 1,
    topic = EXCLUDED.topic, kafka_partition = EXCLUDED.kafka_partition, kafka_offset = EXCLUDED.kafka_offset
WHERE inbox_messages.status = 'requeued'
RETURNING xmax <> 0, CASE WHEN xmax <> 0 THEN (SELECT to_jsonb(o) FROM inbox_messages o WHERE o.consumer = $1 AND o.message_id = $2) END`}

	// RecordBatch is Record for a batch on the fast path, which only
	// meets aggregates nothing holds. A requeued row it meets all the same
	// (a stale dead letter holds nothing) comes back with reapplied set,
	// and the fast path gives the batch up to the message-by-message path,
	// which applies it whatever the guard says. Its DO UPDATE is detection
	// only: a batch that meets a requeued row is always rolled back, so the
	// row is never left processed by it (Record, in the message-by-message
	// path, is the reapply that sticks, with its own SET list).
	RecordBatch = Transition{Name: "record", From: []string{"", StatusRequeued}, To: StatusProcessed, By: ByWorker, SQL: `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
SELECT $1, m.id, m.event_type, m.aggregate_type, m.aggregate_id, m.aggregate_version, m.topic, m.kafka_partition,
       m.kafka_offset, 'processed', sha256(m.payload), now()
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::int[], $9::bigint[], $10::bytea[])
     AS m(id, event_type, aggregate_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset, payload)
ON CONFLICT (consumer, message_id) DO UPDATE
SET status = 'processed', processed_at = now(), last_error = NULL, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'requeued'
RETURNING message_id, xmax <> 0`}

	// Lease takes a new row, or an expired lease of a worker that died
	// (takeover: the previous holder may have called). It returns the
	// fencing token, whether an earlier lease existed, and whether a call
	// may have landed: a takeover, or a new row for a message sent ($13,
	// its Kafka timestamp) before the consumer's database server switched
	// (inbox_servers.check_before; pkg/inbox/lease/lease_server.go): its row may have been
	// lost with the old server.
	Lease = Transition{Name: "lease", From: []string{"", StatusLeased}, To: StatusLeased, By: ByWorker, SQL: `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token, may_have_called)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'leased', sha256($10), $11, now() + $12 * interval '1 microsecond', 1,
        coalesce($13::timestamptz < (SELECT check_before FROM inbox_servers WHERE consumer = $1), false))
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until, may_have_called = true,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING fencing_token, fencing_token > 1, may_have_called`}

	// LeaseBatch is Lease for a batch of distinct event ids, in id order
	// so two consumers claiming overlapping batches lock rows in the same
	// order. Ids it does not return are settled already, leased to a live
	// worker, or requeued (leaseStates tells which).
	LeaseBatch = Transition{Name: "lease", From: []string{"", StatusLeased}, To: StatusLeased, By: ByWorker, SQL: `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token, may_have_called)
SELECT $1, m.id, m.event_type, m.aggregate_type, m.aggregate_id, m.aggregate_version, m.topic, m.kafka_partition,
       m.kafka_offset, 'leased', sha256(m.payload), $11, now() + $12 * interval '1 microsecond', 1,
       coalesce(m.sent_at < (SELECT check_before FROM inbox_servers WHERE consumer = $1), false)
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::int[], $9::bigint[], $10::bytea[],
            $13::timestamptz[])
     AS m(id, event_type, aggregate_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset, payload, sent_at)
ORDER BY m.id
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until, may_have_called = true,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING message_id, fencing_token, fencing_token > 1, may_have_called`}

	// Reclaim leases a requeued row to the worker its redelivery reached.
	// It keeps may_have_called: a letter whose last call may have landed is
	// checked before it is called again. It returns the requeued row as it
	// was (the statement's snapshot), for Repark.
	Reclaim = Transition{Name: "reclaim", From: []string{StatusRequeued}, To: StatusLeased, By: ByWorker, SQL: `
UPDATE inbox_messages
SET status = 'leased', lease_owner = $3, lease_until = now() + $4 * interval '1 microsecond', last_error = NULL,
    fencing_token = fencing_token + 1, attempts = attempts + 1
WHERE consumer = $1 AND message_id = $2 AND status = 'requeued'
RETURNING fencing_token, may_have_called,
          (SELECT to_jsonb(o) FROM inbox_messages o WHERE o.consumer = $1 AND o.message_id = $2)`}

	// ServerSwitch records the database server a lease-mode consumer
	// writes to ($2), and, when a recorded one differs, the switch: a
	// message with no row sent before check_before ($3 after now, the
	// producers' clock margin) may have been called on the old server, and
	// is leased as may_have_called (pkg/inbox/lease/lease_server.go). It returns whether it
	// recorded a switch (no row: another transaction just did).
	ServerSwitch = Transition{Name: "server_switch", From: []string{"", "server"}, To: "server", By: ByWorker, SQL: `
INSERT INTO inbox_servers (consumer, server) VALUES ($1, $2)
ON CONFLICT (consumer) DO UPDATE
SET server = EXCLUDED.server, recorded_at = now(), switched_at = now(), check_before = now() + $3 * interval '1 microsecond'
WHERE inbox_servers.server <> EXCLUDED.server
RETURNING xmax <> 0`}

	// Renew keeps a lease while its holder calls, retries or waits.
	Renew = Transition{Name: "renew", From: []string{StatusLeased}, To: StatusLeased, By: ByHolder, SQL: `
UPDATE inbox_messages SET lease_until = now() + $4 * interval '1 microsecond'
WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`}

	// Done closes one lease as processed.
	Done = Transition{Name: "done", From: []string{StatusLeased}, To: StatusProcessed, By: ByHolder, SQL: `
UPDATE inbox_messages SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`}

	// DoneBatch closes a batch of leases as processed and returns the ones
	// that were still this worker's.
	DoneBatch = Transition{Name: "done", From: []string{StatusLeased}, To: StatusProcessed, By: ByHolder, SQL: `
UPDATE inbox_messages i SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
FROM unnest($2::uuid[], $3::bigint[]) AS m(id, token)
WHERE i.consumer = $1 AND i.message_id = m.id AND i.status = 'leased' AND i.fencing_token = m.token
RETURNING i.message_id`}

	// Uncertain records a side effect nobody can vouch for, for the
	// reconciliation report.
	Uncertain = Transition{Name: "uncertain", From: []string{StatusLeased}, To: StatusUncertain, By: ByHolder, SQL: `
UPDATE inbox_messages SET status = 'uncertain', last_error = $4, lease_owner = NULL, lease_until = NULL, may_have_called = true
WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`}

	// DeadLetterLeased records the dead letter of a leased message, if the
	// lease is still this worker's; $5 says a call may have landed.
	DeadLetterLeased = Transition{Name: "dead_letter_leased", From: []string{StatusLeased}, To: StatusDead, By: ByHolder, SQL: `
UPDATE inbox_messages
SET status = 'dead_lettered', last_error = $4, may_have_called = may_have_called OR $5,
    lease_owner = NULL, lease_until = NULL, aggregate_type = coalesce(aggregate_type, $6)
WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`}

	// DeadLetter records the dead letter of a message no lease covers (the
	// transactional applier's, whose savepoint rolled back; a lease-mode
	// message that could not be leased): a new row, or a requeued one that
	// died again. A row in any other state was settled by another member
	// meanwhile (processed, most likely): the late write changes nothing.
	DeadLetter = Transition{Name: "dead_letter", From: []string{"", StatusRequeued}, To: StatusDead, By: ByWorker, SQL: `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash, may_have_called)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'dead_lettered', $10, sha256($11), $12)
ON CONFLICT (consumer, message_id) DO UPDATE
SET status = 'dead_lettered', last_error = EXCLUDED.last_error, attempts = inbox_messages.attempts + 1,
    may_have_called = inbox_messages.may_have_called OR EXCLUDED.may_have_called
WHERE inbox_messages.status = 'requeued'`}

	// Stale marks rows the version guard skipped, in the transaction that
	// recorded them ($3: processed in the transactional applier, leased in
	// the lease applier's).
	Stale = Transition{Name: "stale", From: []string{StatusProcessed, StatusLeased}, To: StatusStale, By: ByWorker, SQL: `
UPDATE inbox_messages SET status = 'stale', processed_at = coalesce(processed_at, now()), lease_owner = NULL, lease_until = NULL
WHERE consumer = $1 AND message_id = ANY($2) AND status = $3`}

	// Unrecord removes the row a transaction just recorded for a message
	// it parks instead: its release records it then.
	Unrecord = Transition{Name: "unrecord", From: []string{StatusProcessed}, To: "", By: ByWorker, SQL: `
DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND status = 'processed'`}

	// Repark puts back the requeued row that Record (processed) or
	// Reclaim (leased, $4 its fencing token) just took, when ParkCheck
	// parks the message instead: its aggregate is held by an earlier dead
	// message that is not its own (a stale dead letter holds nothing, so
	// its requeue is known only by this row). The row is never deleted
	// (Unrecord, Unlease): it carries the operator's requeue, attempts,
	// last_error and may_have_called, and keeps its original from pruning;
	// its release takes it again as requeued. $3 is the row as it was (nil:
	// only the status goes back); the fencing token stays advanced.
	Repark = Transition{Name: "repark", From: []string{StatusProcessed, StatusLeased}, To: StatusRequeued, By: ByWorker, SQL: `
UPDATE inbox_messages i
SET (status, processed_at, last_error, attempts, topic, kafka_partition, kafka_offset, lease_owner, lease_until) =
    (SELECT 'requeued', o.processed_at, o.last_error, o.attempts, o.topic, o.kafka_partition, o.kafka_offset,
            o.lease_owner, o.lease_until
     FROM jsonb_populate_record(i, coalesce($3::jsonb, '{}'::jsonb)) AS o)
WHERE consumer = $1 AND message_id = $2
  AND (status = 'processed' AND $4::bigint IS NULL OR status = 'leased' AND fencing_token = $4)`}

	// Unlease gives up a lease to park its message (in the transaction
	// that took the lease, or later when an earlier message of its key
	// died), if it is still this worker's.
	Unlease = Transition{Name: "unlease", From: []string{StatusLeased}, To: "", By: ByHolder, SQL: `
DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`}

	// Requeue marks dead letters requeued, and returns the ones it marked:
	// a sweep sends back only those, so two sweeps never send one twice.
	// The row stays (with may_have_called): the redelivery finds it and
	// applies it (reapply, reclaim), instead of taking it for a first
	// delivery.
	Requeue = Transition{Name: "requeue", From: []string{StatusDead}, To: StatusRequeued, By: ByOperator, SQL: `
UPDATE inbox_messages SET status = 'requeued'
WHERE status = 'dead_lettered' AND (consumer, message_id) IN (SELECT * FROM unnest($1::text[], $2::uuid[]))
RETURNING consumer, message_id`}

	// Skip records an operator's skip of a held aggregate's dead messages:
	// they are never applied, and say why ($3).
	Skip = Transition{Name: "skip", From: []string{StatusDead, StatusRequeued}, To: StatusSkipped, By: ByOperator, SQL: `
UPDATE inbox_messages SET status = 'skipped', last_error = $3, processed_at = now()
WHERE consumer = $1 AND message_id = ANY($2) AND status IN ('dead_lettered', 'requeued')`}

	// SkipParkedRow records a parked message an operator skipped (it has
	// no row: parked messages are recorded when applied), so that its
	// redelivery is a duplicate. A row already there was settled: kept.
	SkipParkedRow = Transition{Name: "skip", From: []string{""}, To: StatusSkipped, By: ByOperator, SQL: `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash, processed_at)
SELECT $1, p.id, p.event_type, $2, $3, p.version, p.topic, p.kafka_partition, p.kafka_offset, 'skipped', $4, '\x', now()
FROM unnest($5::uuid[], $6::text[], $7::bigint[], $8::text[], $9::int[], $10::bigint[])
     AS p(id, event_type, version, topic, kafka_partition, kafka_offset)
ON CONFLICT (consumer, message_id) DO NOTHING`}

	// Unrequeue sets a requeued row back to dead_lettered when an operator
	// releases its aggregate: the requeued copy never came (a truncated
	// letter, one lost to retention), and the event stays dead, visible and
	// requeueable.
	Unrequeue = Transition{Name: "release", From: []string{StatusRequeued}, To: StatusDead, By: ByOperator, SQL: `
UPDATE inbox_messages SET status = 'dead_lettered'
WHERE consumer = $1 AND message_id = ANY($2) AND status = 'requeued'`}

	// Prune removes the oldest prunable rows in batches. The rows are
	// picked once (MATERIALIZED: as a subquery in the WHERE clause, a
	// LIMIT … FOR UPDATE may be re-run and remove more than the batch) and
	// rows another pruner holds are skipped, so several pruners share the
	// work; the DELETE names the states again, so a row that moved on
	// since it was picked stays.
	Prune = Transition{Name: "prune", From: []string{StatusProcessed, StatusStale, StatusSkipped}, To: "", By: ByPruner, SQL: `
WITH doomed AS MATERIALIZED (
    SELECT consumer, message_id FROM inbox_messages
    WHERE status IN ('processed', 'stale', 'skipped') AND processed_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM inbox_messages m
USING doomed d
WHERE m.consumer = d.consumer AND m.message_id = d.message_id AND m.status IN ('processed', 'stale', 'skipped')`}
)

// Transitions of the rows that hold an aggregate back.
var (
	// Hold holds a dead message's aggregate, in its dead letter's
	// transaction. A requeued hold whose message died again is dead again.
	Hold = Transition{Name: "hold", From: []string{"", "requeued"}, To: "dead", By: ByWorker, SQL: `
INSERT INTO inbox_dead_keys (consumer, message_id, aggregate_type, aggregate_id, aggregate_version)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, message_id) DO UPDATE SET status = 'dead', dead_at = now(), requeued_at = NULL
WHERE inbox_dead_keys.status = 'requeued'`}

	// RequeueHold marks the holds of requeued messages: the consumer
	// applies a requeued message whatever its version guard says, then
	// releases its aggregate's parked messages.
	RequeueHold = Transition{Name: "requeue_hold", From: []string{"dead"}, To: "requeued", By: ByOperator, SQL: `
UPDATE inbox_dead_keys SET status = 'requeued', requeued_at = now()
WHERE status = 'dead' AND (consumer, message_id) IN (SELECT * FROM unnest($1::text[], $2::uuid[]))`}

	// DropHold releases the aggregate of a requeued message once it is
	// applied, in the transaction that applies it.
	DropHold = Transition{Name: "drop_hold", From: []string{"dead", "requeued"}, To: "", By: ByWorker, SQL: `
DELETE FROM inbox_dead_keys WHERE consumer = $1 AND message_id = $2 AND status IN ('dead', 'requeued')`}

	// ReleaseHolds removes an aggregate's holds for an operator (release
	// or skip), returning the dead messages they were and their states.
	ReleaseHolds = Transition{Name: "release_hold", From: []string{"dead", "requeued"}, To: "", By: ByOperator, SQL: `
DELETE FROM inbox_dead_keys
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND status IN ('dead', 'requeued')
RETURNING message_id, status, aggregate_version`}

	// Park stores a message behind its aggregate's dead or parked ones.
	Park = Transition{Name: "park", From: []string{""}, To: "parked", By: ByWorker, SQL: `
INSERT INTO inbox_parked_messages (consumer, message_id, aggregate_type, aggregate_id, aggregate_version, event_type,
                                   blocked_by, topic, kafka_partition, kafka_offset, msg_key, msg_value, msg_headers)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (consumer, message_id) DO NOTHING`}

	// Unpark removes a released message from the parking once the inbox
	// settled it.
	Unpark = Transition{Name: "unpark", From: []string{"parked"}, To: "", By: ByWorker, SQL: `
DELETE FROM inbox_parked_messages WHERE consumer = $1 AND message_id = $2`}

	// SkipParked removes an aggregate's parked messages for an operator's
	// skip, returning them so each is recorded skipped.
	SkipParked = Transition{Name: "skip_parked", From: []string{"parked"}, To: "", By: ByOperator, SQL: `
DELETE FROM inbox_parked_messages
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
RETURNING message_id, event_type, aggregate_version, topic, kafka_partition, kafka_offset`}

	// RecordAction records an operator's release or skip, with its
	// reason: the audit of what was let go or never applied.
	RecordAction = Transition{Name: "record_action", From: []string{""}, To: "recorded", By: ByOperator, SQL: `
INSERT INTO inbox_operator_actions (consumer, aggregate_type, aggregate_id, action, reason, operator, dead_messages, parked)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`}

	// KeepOriginal keeps the whole message of a dead letter the topic
	// took only truncated ($9: in the topic) or refused even so, in the
	// dead letter's transaction. A later dead-lettering of the same message
	// keeps the first original (the same message) and says where the
	// latest letter is.
	KeepOriginal = Transition{Name: "keep_original", From: []string{"", "kept"}, To: "kept", By: ByWorker, SQL: `
INSERT INTO inbox_dead_letter_originals (consumer, message_id, topic, kafka_partition, kafka_offset, msg_key, msg_value, msg_headers,
                                         in_topic, dead_letter_topic)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (consumer, message_id) DO UPDATE SET in_topic = EXCLUDED.in_topic
WHERE inbox_dead_letter_originals.in_topic <> EXCLUDED.in_topic`}

	// PruneOriginals removes the kept originals of messages that are no
	// longer dead (applied, skipped, or pruned).
	PruneOriginals = Transition{Name: "prune_originals", From: []string{"kept"}, To: "", By: ByPruner, SQL: `
DELETE FROM inbox_dead_letter_originals o
WHERE NOT EXISTS (SELECT 1 FROM inbox_messages i WHERE i.consumer = o.consumer AND i.message_id = o.message_id
                  AND i.status IN ('dead_lettered', 'requeued'))
  AND o.stored_at < now() - $1::bigint * interval '1 microsecond'`}

	// Advance moves the version guard of a batch's aggregates forward,
	// never back.
	Advance = Transition{Name: "advance", From: []string{"", "version"}, To: "version", By: ByWorker, SQL: `
INSERT INTO inbox_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
SELECT $1, a.aggregate_type, a.aggregate_id, a.version
FROM unnest($2::text[], $3::text[], $4::bigint[]) AS a(aggregate_type, aggregate_id, version)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
SET version = EXCLUDED.version, updated_at = now()
WHERE inbox_aggregate_versions.version < EXCLUDED.version`}

	// AdvanceOne is Advance for one aggregate, returning the version it
	// found (NULL when unseen).
	AdvanceOne = Transition{Name: "advance", From: []string{"", "version"}, To: "version", By: ByWorker, SQL: `
WITH prev AS (
    SELECT version FROM inbox_aggregate_versions
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
    FOR UPDATE
), up AS (
    INSERT INTO inbox_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
    SET version = EXCLUDED.version, updated_at = now()
    WHERE inbox_aggregate_versions.version < EXCLUDED.version
)
SELECT (SELECT version FROM prev)`}

	// Unreserve moves the version guard back below a dead leased message
	// (park mode): the lease applier advances it when it leases, before the
	// effect, and the later versions leased with it are parked, so none of
	// them is applied. It goes back to the highest version below the dead
	// one that the inbox records as applied (or being applied, or maybe
	// applied) for this aggregate — its type and its id: another type that
	// shares the id (an order and its payment) has versions of its own —,
	// 0 when there is none; not to "dead − 1": an earlier version that
	// never arrived would then be skipped as stale. The inbox keeps those
	// rows for Config.Retention; a message redelivered after its row was
	// pruned, while a later version of its aggregate is dead, would pass
	// the guard.
	Unreserve = Transition{Name: "unreserve", From: []string{"version"}, To: "version", By: ByHolder, SQL: `
UPDATE inbox_aggregate_versions SET updated_at = now(), version = coalesce((
    SELECT max(aggregate_version) FROM inbox_messages
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND aggregate_version < $4
      AND status IN ('processed', 'leased', 'uncertain')), 0)
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version >= $4`}
)

// lifecycle lists every transition, for the docs test and the metric's
// labels.
var Lifecycle = []*Transition{
	&Record, &RecordBatch, &Lease, &LeaseBatch, &ServerSwitch, &Reclaim, &Renew, &Done, &DoneBatch, &Uncertain,
	&DeadLetterLeased, &DeadLetter, &Stale, &Unrecord, &Repark, &Unlease, &Requeue, &Skip, &SkipParkedRow, &Unrequeue, &Prune,
	&Hold, &RequeueHold, &DropHold, &ReleaseHolds, &Park, &Unpark, &SkipParked, &RecordAction, &KeepOriginal,
	&PruneOriginals, &Advance, &AdvanceOne, &Unreserve,
}

// execer is what a transition runs on: a pool, a transaction, a savepoint.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Take runs tr on q and reports whether it changed a row. A row that is not
// in a state tr expects (or carries another fencing token) is left alone:
// take then reports false, and the caller decides whether that is a refusal
// (refused) or an ordinary answer (a duplicate).
func Take(ctx context.Context, q Execer, tr *Transition, args ...any) (bool, error) {
	tag, err := q.Exec(ctx, tr.SQL, args...)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// takeCount runs tr on q and returns how many rows it changed, for a
// caller that compares them with the rows it expects.
func TakeCount(ctx context.Context, q Execer, tr *Transition, args ...any) (int, error) {
	tag, err := q.Exec(ctx, tr.SQL, args...)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// TakeQuery runs tr, a transition with RETURNING, on q.
func TakeQuery(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, tr *Transition, args ...any) (pgx.Rows, error) {
	return q.Query(ctx, tr.SQL, args...)
}

// The actions RecordAction records in inbox_operator_actions.action, and
// the action label of inbox_operator_actions_total.
const (
	ActionRelease = "release"
	ActionSkip    = "skip"
)
