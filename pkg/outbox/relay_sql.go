package outbox

// Every statement the polling relay (relay.go) runs, in one place: its
// wake-up (LISTEN/NOTIFY and arming), its claim and marks, and its
// partition ownership.

// wakeFenceKey is the advisory lock (class advisoryLockClass) that orders
// arming against writers checking whether to notify; migration 0004 takes it
// shared in the insert trigger.
const wakeFenceKey = -1

// arm marks this relay as waiting, so writers notify on commit. Taking the
// fence exclusively waits for every writer that checked the flag before it
// was set: their rows are committed before the claim that follows arming.
// It runs in a transaction of its own, committed in the claim's round trip
// before the claim's transaction begins: held through the claim, the fence
// would make writers' commits wait for the Kafka publish.
//
// The fence also holds back every writer that comes to it after the relay
// asked for it (PostgreSQL queues a shared request behind a waiting
// exclusive one) until the arming transaction ends, so that transaction
// commits without waiting for its WAL flush (armSettings): writers then wait
// for the commits already under way, not for one more flush. A crash that
// loses the flag loses no event: the relay is not woken, and its poll
// (PollInterval) claims the rows.
const arm = `
WITH fence AS (SELECT pg_advisory_xact_lock($2::int, $3::int))
UPDATE outbox_relays SET waiting = true FROM fence WHERE id = $1`

// armSettings makes the arming transaction's commit asynchronous (see arm).
const armSettings = `SELECT set_config('synchronous_commit', 'off', true)`

// disarm runs in the claim transaction, so it costs no round trip of its own.
const disarm = `UPDATE outbox_relays SET waiting = false WHERE id = $1 AND waiting`

// fenceLockClass namespaces the per-partition claim fences (two-key form:
// class, partition); see fencePartitions.
const fenceLockClass = 0x6f627832 // "obx2"

// fencePartitions takes, for the claim transaction, an exclusive lock per
// owned partition, in partition order (so two claims cannot deadlock).
//
// This, not the ownership lock, is what keeps a partition's events in order
// when it changes hands. The ownership lock is held on another connection
// and changes on the heartbeat goroutine, whenever the share changes, so a
// partition may be released, or lost with the lock connection, while a
// batch of it is in flight. FOR UPDATE alone would make the new owner wait
// for the in-flight rows, but not for the rest: its claim's snapshot was
// taken before the old batch committed, so it would not see that a row of
// that batch failed and now holds its aggregate back, and could publish the
// aggregate's next event first. The fence makes every claim of a partition
// wait for the previous claim transaction of that partition to end before
// it reads anything, so each claim sees everything the previous one wrote,
// whoever owns the partition, and even while two relays both believe they do.
//
// It is a statement of its own, after the settings and before the claim:
// in READ COMMITTED a statement reads from a snapshot taken when it starts,
// so a claim that took the fence itself would read from before the wait,
// which is the very overtaking the fence is there to stop. The pipeline
// makes the three statements one round trip anyway (relayBatch).
const fencePartitions = `SELECT count(pg_advisory_xact_lock($1, p)) FROM unnest($2::int[]) AS p`

// claimSettings are the claim transaction's: a bounded wait for locks (a
// handover), and a commit that need not wait for the disk, because a mark
// lost in a crash only republishes the batch, which consumers absorb
// (BENCHMARKS.md).
const claimSettings = `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true)`

// undeferOutage makes the rows an outage deferred due again once their topic
// takes writes again, rather than each waiting out its own deferral. Only
// an outage defers a row without charging an attempt, so attempts = 0 with
// a future next_attempt_at identifies them (a requeue resets
// next_attempt_at). Scoped to the aggregate types of the topic that
// recovered: a topic that is still missing keeps its rows deferred.
const undeferOutage = `
UPDATE outbox_events SET next_attempt_at = '-infinity'
WHERE state = 'pending' AND attempts = 0 AND next_attempt_at > '-infinity' AND next_attempt_at > now()
  AND partition = ANY($1) AND aggregate_type = ANY($2)`

// claimBatch takes the next due rows of the owned partitions in id order.
// A row waits while an earlier row of its aggregate is dead or backing off,
// so a retry never lets a later event overtake. FOR UPDATE without SKIP
// LOCKED: rows someone else holds (an operator's requeue, say) are waited
// for, not skipped, so they cannot be overtaken either.
const claimBatch = `
SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version,
       o.event_type, o.event_version, o.payload, o.headers, o.occurred_at, o.created_at, o.attempts
FROM outbox_events o
WHERE o.state = 'pending' AND o.next_attempt_at <= now() AND o.partition = ANY($2)
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events e
      WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id
        AND (e.state = 'dead' OR (e.state = 'pending' AND e.next_attempt_at > '-infinity'))
        AND (e.state = 'dead' OR e.next_attempt_at > now()))
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o`

// markPublished is the polling relay's claimed → published (internal/lifecycle);
// the caller checks that every row it names was pending.
const markPublished = `
UPDATE outbox_events
SET state = 'published', published_at = now(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY($1) AND state = 'pending'`

// markFailed is claimed → pending (an attempt charged) or → dead.
const markFailed = `
UPDATE outbox_events
SET attempts = attempts + 1,
    last_error = $2,
    next_attempt_at = now() + $3 * interval '1 microsecond',
    state = CASE WHEN attempts + 1 >= $4 THEN 'dead' ELSE 'pending' END
WHERE id = $1 AND state = 'pending'
RETURNING state`

// markDeferred puts off rows the broker could not take, without charging
// an attempt: the deferral lets the relay move past a topic or partition
// that is unavailable, and holds back the rows' aggregates meanwhile.
const markDeferred = `
UPDATE outbox_events o
SET last_error = d.last_error, next_attempt_at = now() + d.delay_us * interval '1 microsecond'
FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS d(id, last_error, delay_us)
WHERE o.id = d.id AND o.state = 'pending'`

// heartbeat registers the relay or refreshes its registration, forgets
// relays whose heartbeat is older than the TTL, and counts the live ones. It
// also says whether it created the registration (xmax is 0 on a row the
// INSERT wrote, and the conflicting row's xid after an ON CONFLICT update).
const heartbeat = `
WITH beat AS (
    INSERT INTO outbox_relays (id) VALUES ($1)
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
    RETURNING xmax = 0 AS created
), gone AS (
    DELETE FROM outbox_relays WHERE heartbeat_at < now() - $2 * interval '1 microsecond' AND id <> $1
)
SELECT (SELECT count(*) + 1 FROM outbox_relays WHERE id <> $1 AND heartbeat_at >= now() - $2 * interval '1 microsecond'),
       (SELECT created FROM beat)`

const releasePartitions = `SELECT pg_advisory_unlock($1, p) FROM unnest($2::int[]) AS p`

// takePartitions tries the candidates in the given (shuffled) order.
// pg_try_advisory_lock is evaluated row by row until LIMIT is met, so this
// takes at most the missing share in one round trip.
const takePartitions = `
SELECT p FROM unnest($2::int[]) AS p
WHERE pg_try_advisory_lock($1, p)
LIMIT $3`

const deregister = `DELETE FROM outbox_relays WHERE id = $1`
