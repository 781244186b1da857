// Package lifecycle is the outbox's lifecycles, written down once (DESIGN.md invariant 11,
// STYLE.md rule 25), for both relays: the states of an event row and of a slot record, the
// transitions between them, who may take each, and the statement that
// takes it. Every transition is one statement that names the state it
// expects; a statement that finds the row elsewhere changes nothing, and
// the writer is refused: counted in
// outbox_transitions_refused_total{transition} and logged (metrics.Refuse). The
// diagrams are in docs/outbox.md ("Lifecycles").
//
// # The event row (outbox_events)
//
//	state      who writes it          from            statement
//	pending    the service (Enqueue)  —               INSERT (outbox/enqueue.go)
//	claimed    polling relay          pending, due    claimBatch: FOR UPDATE under the partition fence (a lock, not a column)
//	published  polling relay          claimed         markPublished … AND state = 'pending'
//	pending    polling relay          claimed         markFailed / markDeferred … AND state = 'pending' (attempts +1, or deferred)
//	dead       polling relay          claimed         markFailed, attempts exhausted
//	dead       log-based relay        pending         markDeadCDC … AND state = 'pending' (skipped, or held back behind a dead one;
//	                                                  a row not visible yet, its commit flushed but not ended, is waited for: cdc markDead)
//	pending    operator (poll)        dead            requeueSet … AND state = 'dead'
//	copy       operator (cdc)         dead            DELETE … state = 'dead' + INSERT of a pending copy, one statement
//	copy       operator (cdc replay)  published*      DELETE … in replayScopeCDC + INSERT of a pending copy, one statement
//	deleted    retention (cdc)        published*      deleteConfirmedBatch … AND state = 'pending' AND published*
//	deleted    Pruner, admin Prune    published       pruneStatement … state = 'published' (or pending past PendingRetention)
//
// "held back" is a dead row whose last_error names the dead event ahead of
// it; "requeued copy" is a pending row whose event id a dead row had, under
// a new id (the log-based relay reads only inserts, so a row is never set
// back in place there).
//
// published* is what the log-based relay published: it never updates a
// row, so "published" is derived, and from something commit-ordered, never
// from the highest id (ids are drawn at INSERT, not at commit): a pending
// row whose inserting transaction is older than the slot record's
// published_xmin (see below). outboxadmin.Backlog, retention and the cdc replay's scope
// share that one test (publishedCDC).
//
// # The slot record (outbox_cdc_slots)
//
//	field / state        who writes it                  statement
//	gap marked           the relay creating a slot      markGap: gap_pending, a new generation (created_at), horizon reset
//	replaying            the slot's holder              reads gap_pending = true at its start (replayGap)
//	streaming            the slot's holder              gapReplayed … AND gap_pending AND created_at = <its generation>
//	confirmed position   the slot's holder              recordConfirmed … AND created_at = <its generation>
//	horizon, published   the retention beside a stream  advanceHorizon … AND NOT gap_pending
//
// The horizon is an xid and the WAL insert position read just after it
// (horizon_xmin, horizon_lsn): every transaction of this database older
// than the xid had ended when it was read (horizonXid: the oldest running
// in this database, not the cluster-wide snapshot xmin, which let another
// database's open transaction hold this one's back), so its commit record
// is below horizon_lsn. Once the slot's recorded confirmed position passes
// horizon_lsn, every such transaction was decoded and acknowledged by
// Kafka, and horizon_xmin becomes published_xmin. A new slot (markGap)
// drops the pending horizon: its positions say nothing about the old
// slot's; the gap replay sets published_xmin itself once it republished
// every row older than its start.
//
// # The relay's ownership
//
// Polling relay: a logical partition is owned by whoever holds its session
// advisory lock (outbox/relay.go), and each claim first takes the partition's
// fence (fencePartitions), so a claim sees everything the previous claim
// of that partition wrote, whoever held it. Log-based relay: the slot is
// owned by the walsender that runs START_REPLICATION on it (Postgres
// refuses a second with 55006); only that holder replays the gap, records
// positions or marks rows dead, and only for the generation it started on.
package lifecycle

// The states of an event row (the CHECK on outbox_events.state).
const (
	StatePending   = "pending"
	StatePublished = "published"
	StateDead      = "dead"
)

// NotifyChannel is where a row that became pending is announced to the
// polling relays, which LISTEN on it: by the insert trigger (migrations
// 0001 and 0004), and by the operator's requeue and replay (WakeRelays),
// which make rows due without inserting them.
const NotifyChannel = "outbox_events"

// WakeRelays wakes the polling relays, so that they need not wait for their
// poll.
const WakeRelays = `SELECT pg_notify('` + NotifyChannel + `', '')`

// The transitions a writer may be refused, by the label of
// outbox_transitions_refused_total.
const (
	TransitionMarkPublished  = "mark_published"  // polling relay: claimed → published
	TransitionMarkFailed     = "mark_failed"     // polling relay: claimed → pending (attempt charged) or dead
	TransitionMarkDead       = "mark_dead"       // log-based relay: pending → dead
	TransitionRecordPosition = "record_position" // slot holder: confirmed position, its generation only
	TransitionGapReplayed    = "gap_replayed"    // slot holder: replaying → streaming
)

// PublishedCDC is the one test of "published" for a pending row of the
// log-based relay, which never marks a row (migration 0008): its inserting
// transaction is older than a slot record's published_xmin, whose commits
// the slot confirmed. row names outbox_events in the statement. id <=
// confirmed_id is only an upper bound that keeps the scan short (no
// published row lies above it); it is never the test itself: ids are drawn
// at INSERT, not at commit. Retention, the cdc replay's scope and outboxadmin.Backlog
// share it.
func PublishedCDC(row string) string {
	return `EXISTS (SELECT 1 FROM outbox_cdc_slots s
    WHERE ` + row + `.id <= s.confirmed_id AND age(` + row + `.xmin) > age(s.published_xmin))`
}

// BacklogPending is "not yet published", in every relay mode: a row the
// polling relay published is marked so, and one the log-based relay
// published (PublishedCDC: its commit confirmed by the slot) stays
// 'pending' until retention deletes it, so it is left out; counting it made
// a longer cdc.Config.Retain read as a stuck relay. Under Debezium the table
// cannot tell what was published: every row stays pending (see
// docs/outbox.md). The backlog gauges and outboxadmin.Backlog share it.
var BacklogPending = `state = 'pending' AND NOT ` + PublishedCDC("outbox_events")
