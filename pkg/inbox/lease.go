package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// ErrUnknowable is what Effect.Check returns when the other side answered
// but cannot say whether it already has an idempotency key (its answer does
// not decide it). The message is marked 'uncertain' for reconciliation.
var ErrUnknowable = errors.New("cannot tell whether the side effect happened")

// ErrUnavailable is what Effect.Check and Effect.Call wrap when the other
// side cannot be reached or cannot serve now (connection refused, a
// timeout, a 5xx): an outage, not the message's fault. It is waited out
// with capped backoff (BackoffMin to BackoffMax), counted
// (inbox_effect_errors_total), shown (inbox_effect_connected,
// Consumer.Healthy), never charged as an attempt and never a dead letter by
// itself. A Call that failed so may still have landed: the next try checks
// first. A call cut off by Config.CallTimeout counts as one.
var ErrUnavailable = errors.New("the other side of the side effect is unavailable")

// Outcome is how a leased message's side effect was settled.
type Outcome string

// The outcomes Effect.Done is told about.
const (
	// Sent: this delivery performed the side effect.
	Sent Outcome = "sent"
	// AlreadyPresent: an earlier delivery performed it (and then crashed or
	// timed out before marking done); the other side confirmed the key.
	AlreadyPresent Outcome = "already_present"
)

// Effect is a side effect outside the database, such as a call to a third
// party that cannot be made idempotent. The consumer runs it in lease mode:
//
//  1. claim the message: its inbox row becomes 'leased' to this worker until
//     LeaseTTL from now, with a fencing token that grows with every lease;
//  2. call out with the event id as the idempotency key;
//  3. mark the row done, only if the fencing token is still this worker's,
//     and run Done in that same transaction.
//
// A worker does 1 and 3 for a batch of messages at a time, in one
// transaction each, and 2 for distinct keys concurrently; Check and Call
// must be safe for concurrent use.
//
// If a worker dies between 2 and 3, the lease expires and the next delivery
// takes it over. It must not call blindly: it first asks Check. Found: the
// row is marked done as AlreadyPresent without calling. Not found: it calls.
// Unknowable: the row is marked 'uncertain' for the reconciliation report and
// nothing is called. The same check precedes every retry after a failed Call,
// since a timed-out call may have landed.
//
// A worker acts only under a lease it holds. Each Check and each Call takes
// one of the MaxInFlight call slots, then renews the lease under its
// fencing token, and only then starts, with a ctx that ends CallTimeout
// after that renewal: at least LeaseTTL - CallTimeout before the lease can
// expire, which leaves LeaseMargin for a call to land after its ctx ended.
// A renewal that finds the token changed (another worker took the message
// over) ends the message's work in this worker at once, and the later
// messages of its key in this worker's hands are abandoned with it (they are
// redelivered, after it). So a takeover, which needs the lease expired,
// comes after the previous holder's last possible call has ended and landed
// (see the package doc for the window that remains).
type Effect struct {
	// Check asks the other side whether it already has key. Return an
	// error wrapping ErrUnavailable when the other side cannot be reached
	// or cannot serve (waited out), and ErrUnknowable when it answered but
	// its answer does not decide (the message is marked uncertain).
	// It must return once ctx ends. Required.
	Check func(ctx context.Context, key string) (bool, error)
	// Call performs the side effect, passing key along. An error wrapping
	// ErrPermanent dead-letters the message; one wrapping ErrUnavailable is
	// an outage, waited out; others are retried up to MaxAttempts. It must
	// send nothing once ctx has ended. Required.
	Call func(ctx context.Context, ev event.Envelope, key string) error
	// Done records the outcome in the consumer's database, in the
	// transaction that marks the message done: one transaction for the
	// messages of a batch, so an error rolls back the batch's marking, and
	// each message is then marked done in a transaction of its own. Optional.
	Done func(ctx context.Context, tx pgx.Tx, ev event.Envelope, outcome Outcome) error
}

// CrashAfterEffect is the crash point between a leased message's side effect
// and marking it done.
const CrashAfterEffect = "inbox.after-effect"

// NewLeaseConsumer returns a consumer that runs eff for each event in lease
// mode (see Effect). Dedupe, the version guard, upcasters, dead letters,
// workers and offsets work as in NewConsumer. Each worker leases a batch of
// messages in one transaction, calls out for them — distinct keys
// concurrently, up to Config.MaxInFlight calls at once, each key's messages
// in order — and marks them done in one transaction.
func NewLeaseConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, eff Effect, cfg Config) (*Consumer, error) {
	if eff.Check == nil || eff.Call == nil {
		return nil, errors.New("inbox: an Effect needs Check and Call")
	}
	noHandler := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
	c, err := NewConsumer(pool, src, dlq, noHandler, cfg)
	if err != nil {
		return nil, err
	}
	c.effect = &eff
	c.calls = make(chan struct{}, c.cfg.MaxInFlight)
	m := c.cfg.Metrics
	c.other = newFault("the third party", c.cfg.Name, c.cfg.Logger, c.cfg.ErrorLogInterval, m.effectErrors, m.effectConnected)
	for _, op := range []string{opCheck, opCall} {
		m.effectErrors.WithLabelValues(c.cfg.Name, op)
	}
	return c, nil
}

// The SQL of the lease applier. Each statement names the fencing token it
// expects, so a worker whose lease was taken over changes nothing.
const (
	// claimLease takes the message's inbox row: a new row, or an expired
	// lease of a worker that died. It returns the fencing token and whether
	// an earlier lease existed (so the side effect may have happened).
	claimLease = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'leased', sha256($9), $10, now() + $11 * interval '1 microsecond', 1)
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING fencing_token, fencing_token > 1`

	// claimLeases is claimLease for a batch of distinct event ids, in id
	// order so two consumers claiming overlapping batches lock rows in the
	// same order. Ids it does not return are settled already or leased to
	// a live worker (leaseStates tells which).
	claimLeases = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token)
SELECT $1, m.id, m.event_type, m.aggregate_id, m.aggregate_version, m.topic, m.kafka_partition,
       m.kafka_offset, 'leased', sha256(m.payload), $10, now() + $11 * interval '1 microsecond', 1
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[], $8::bigint[], $9::bytea[])
     AS m(id, event_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset, payload)
ORDER BY m.id
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING message_id, fencing_token, fencing_token > 1`

	// leaseState reads what keeps a message from being leased.
	leaseState = `SELECT status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = $2`

	// leaseStates is leaseState for a batch.
	leaseStates = `
SELECT message_id, status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = ANY($2)`

	// renewLease keeps a lease while its holder retries or waits its turn.
	renewLease = `
UPDATE inbox_messages SET lease_until = now() + $4 * interval '1 microsecond'
WHERE consumer = $1 AND message_id = $2 AND fencing_token = $3 AND status = 'leased'`

	// markLeaseDone closes one lease as processed.
	markLeaseDone = `
UPDATE inbox_messages SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`

	// markLeasesDone closes a batch of leases as processed and returns the
	// ones that were still this worker's.
	markLeasesDone = `
UPDATE inbox_messages i SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
FROM unnest($2::uuid[], $3::bigint[]) AS m(id, token)
WHERE i.consumer = $1 AND i.message_id = m.id AND i.status = 'leased' AND i.fencing_token = m.token
RETURNING i.message_id`

	// markLeaseUncertain records a side effect nobody can vouch for.
	markLeaseUncertain = `
UPDATE inbox_messages SET status = 'uncertain', last_error = $4, lease_owner = NULL, lease_until = NULL
WHERE consumer = $1 AND message_id = $2 AND fencing_token = $3`
)

// errLeaseLost says a lease this worker took was taken over (it expired and
// another worker leased the message): the new holder settles the message.
var errLeaseLost = errors.New("the lease was taken over")

// leasePlan is what the batch's lease transaction decided for a message.
type leasePlan int

const (
	// planAlone: the message is settled on its own (processLeased): it did
	// not decode, another worker holds its lease, or the batch's lease
	// transaction failed.
	planAlone leasePlan = iota
	// planRepeat: the message repeats an event id earlier in the batch (a
	// producer's retry): a duplicate, settled in its key's turn after the
	// first one.
	planRepeat
	// planSettled: a duplicate or a stale event; nothing to call.
	planSettled
	// planLeased: leased by the batch; call under the lease, then mark done
	// with the batch.
	planLeased
)

// leaseItem is one message of a batch handled in lease mode.
type leaseItem struct {
	d        delivery
	ev       event.Envelope
	decoded  bool
	plan     leasePlan
	token    int64
	taken    bool // an expired lease was taken over: check before calling
	counts   [numOutcomes]int
	mismatch bool // planRepeat: its payload differs from the first's

	// After its key's turn:
	result  leaseResult
	outcome Outcome    // the side effect's, when result is leaseCalled
	span    trace.Span // the consumer span, ended once the message is settled
}

type leaseResult int

const (
	leaseSettled   leaseResult = iota // nothing more to do: duplicate, stale, dead letter, uncertain, or done alone
	leaseCalled                       // the side effect happened: mark done with the batch
	leaseAbandoned                    // unfinished; redelivered later
)

// processLeasedBatch settles a batch in lease mode:
//
//  1. one transaction leases every message it can (claimLeases), skips
//     duplicates and stale events, and advances the version guard;
//  2. each key's messages run their side effects in order, one after the
//     other, while distinct keys run concurrently (MaxInFlight bounds the
//     calls in flight across the consumer);
//  3. one transaction marks every called message done (markLeasesDone) and
//     runs Effect.Done for each.
//
// A message the batch cannot lease (another worker holds it, or the lease
// transaction failed) is settled alone, in its key's turn, as before
// batching. Every message is finished (done or abandoned) when it returns;
// a crash point firing returns a *crashError and abandons what is not
// marked done.
func (c *Consumer) processLeasedBatch(ctx context.Context, batch []delivery) error {
	start := time.Now()
	items := make([]*leaseItem, len(batch))
	for i, d := range batch {
		it := &leaseItem{d: d}
		if ev, err := event.FromKafka(d.m); err == nil {
			it.ev, it.decoded = ev, true
		}
		items[i] = it
	}
	c.leaseBatch(ctx, items)

	// Each key's turn, keys side by side. A crash stops every turn.
	turnCtx, stopTurns := context.WithCancel(ctx)
	defer stopTurns()
	var (
		order []string
		turns = map[string][]*leaseItem{}
		crash atomic.Pointer[crashError]
		wg    sync.WaitGroup
	)
	for _, it := range items {
		k := string(it.d.m.Key)
		if turns[k] == nil {
			order = append(order, k)
		}
		turns[k] = append(turns[k], it)
	}
	for _, k := range order {
		wg.Go(func() {
			mayBeHeld := false // an earlier message of the key was settled without its call: perhaps dead
			for i, it := range turns[k] {
				if mayBeHeld && it.plan == planLeased {
					// Leased with the batch, before the dead one died.
					switch parkedNow, err := c.parkLeasedIfHeld(turnCtx, it); {
					case err != nil:
						for _, rest := range turns[k][i:] {
							rest.result = leaseAbandoned
						}
						return
					case parkedNow:
						it.result = leaseSettled
						continue
					}
				}
				err := c.runLeased(turnCtx, it)
				if it.result == leaseSettled && (it.plan == planAlone || it.plan == planLeased) {
					mayBeHeld = true
				}
				var ce *crashError
				if errors.As(err, &ce) {
					crash.CompareAndSwap(nil, ce)
					stopTurns()
				}
				if err != nil {
					// The key's later messages wait for this one: they are
					// abandoned with it, and redelivered after it.
					for _, rest := range turns[k][i:] {
						rest.result = leaseAbandoned
					}
					return
				}
			}
		})
	}
	wg.Wait()

	var called []*leaseItem
	if crash.Load() == nil {
		for _, it := range items {
			if it.result == leaseCalled {
				called = append(called, it)
			}
		}
		if err := c.markBatchDone(ctx, called); err != nil {
			for _, it := range called {
				it.result = leaseAbandoned
			}
		}
	}
	var (
		counts  [numOutcomes]int
		done    []delivery
		batched int // settled through the batch, not alone (processLeased records those)
	)
	for _, it := range items {
		if it.span != nil {
			it.span.End()
		}
		if crash.Load() != nil || it.result == leaseAbandoned {
			it.d.gen.finish(it.d.m, false)
			continue
		}
		for i, n := range it.counts {
			counts[i] += n
		}
		if it.plan != planAlone {
			batched++
		}
		done = append(done, it.d)
	}
	if ce := crash.Load(); ce != nil {
		return ce
	}
	c.cfg.Metrics.record(c.cfg.Name, counts, batched, time.Since(start))
	return c.committed(ctx, done)
}

// leaseBatch runs the batch's lease transaction and sets each item's plan.
// When the transaction fails, every item is left to planAlone, which waits
// out an outage and charges failures to the message that caused them.
func (c *Consumer) leaseBatch(ctx context.Context, items []*leaseItem) {
	seen := map[uuid.UUID]*leaseItem{}
	var fresh []*leaseItem // decoded, first of their event id in the batch
	for _, it := range items {
		switch first := seen[it.ev.EventID]; {
		case !it.decoded:
		case first != nil:
			it.plan = planRepeat
			it.counts[duplicate]++
			if !bytes.Equal(first.ev.Payload, it.ev.Payload) {
				it.mismatch = true
			}
		default:
			seen[it.ev.EventID] = it
			fresh = append(fresh, it)
		}
	}
	if len(fresh) == 0 {
		return
	}
	var notes []func()
	plans := make(map[uuid.UUID]*leaseItem, len(fresh))
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		clear(plans)
		// A held aggregate's messages are left to planAlone, where each is
		// parked or released on its own (park.go).
		fresh, err := c.unheld(ctx, tx, fresh)
		if err != nil || len(fresh) == 0 {
			return err
		}
		n := len(fresh)
		ids, types, aggs, versions := make([][16]byte, n), make([]string, n), make([]string, n), make([]int64, n)
		topics, partitions, offsets, payloads := make([]string, n), make([]int32, n), make([]int64, n), make([][]byte, n)
		for i, it := range fresh {
			ev, m := it.ev, it.d.m
			ids[i], types[i], aggs[i], versions[i] = ev.EventID, ev.EventType, ev.AggregateID, ev.AggregateVersion
			topics[i], partitions[i], offsets[i], payloads[i] = m.Topic, int32(m.Partition), m.Offset, []byte(ev.Payload)
		}
		rows, err := tx.Query(ctx, claimLeases, c.cfg.Name, ids, types, aggs, versions, topics, partitions, offsets, payloads,
			c.cfg.LeaseOwner, c.cfg.LeaseTTL.Microseconds())
		if err != nil {
			return dbErrors.Translate("leasing a batch", err)
		}
		type claim struct {
			id    [16]byte
			token int64
			taken bool
		}
		claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) {
			var cl claim
			return cl, r.Scan(&cl.id, &cl.token, &cl.taken)
		})
		if err != nil {
			return dbErrors.Translate("leasing a batch", err)
		}
		byID := make(map[uuid.UUID]*leaseItem, n)
		for _, it := range fresh {
			byID[it.ev.EventID] = it
		}
		var leased, unclaimed []uuid.UUID
		tokens := map[uuid.UUID]claim{}
		for _, cl := range claims {
			tokens[cl.id] = cl
			leased = append(leased, cl.id)
		}
		for _, it := range fresh {
			if _, ok := tokens[it.ev.EventID]; !ok {
				unclaimed = append(unclaimed, it.ev.EventID)
			}
		}
		// Unclaimed: settled already (a duplicate), or leased to a live
		// worker (its own turn waits for that lease).
		var dups []event.Envelope
		if len(unclaimed) > 0 {
			rows, err := tx.Query(ctx, leaseStates, c.cfg.Name, unclaimed)
			if err != nil {
				return dbErrors.Translate("reading leases", err)
			}
			var (
				id     [16]byte
				status string
				until  *time.Time
			)
			if _, err := pgx.ForEachRow(rows, []any{&id, &status, &until}, func() error {
				it := byID[id]
				if status == "leased" && until != nil {
					return nil // planAlone
				}
				dups = append(dups, it.ev)
				d := *it
				d.plan = planSettled
				d.counts[duplicate]++
				plans[id] = &d
				return nil
			}); err != nil {
				return dbErrors.Translate("reading leases", err)
			}
		}
		if err := c.checkPayloads(ctx, tx, dups...); err != nil {
			return err
		}
		// The version guard, for the messages leased for the first time.
		evs := make([]event.Envelope, 0, len(leased))
		outs := make([]outcome, 0, len(leased))
		for _, it := range fresh {
			cl, ok := tokens[it.ev.EventID]
			if !ok {
				continue
			}
			d := *it
			d.plan, d.token, d.taken = planLeased, cl.token, cl.taken
			plans[it.ev.EventID] = &d
			out := duplicate // taken over: guarded when it was first leased
			if !cl.taken {
				out = processed
			}
			evs, outs = append(evs, it.ev), append(outs, out)
		}
		if !c.cfg.DisableVersionGuard {
			if notes, err = c.guardBatch(ctx, tx, evs, outs); err != nil {
				return dbErrors.Translate("checking aggregate versions", err)
			}
			for i, out := range outs {
				if out == stale {
					p := plans[evs[i].EventID]
					p.plan = planSettled
					p.counts[stale]++
				}
			}
		}
		return nil
	})
	if err != nil {
		if isOutage(err) {
			c.db.fail(ctx, "lease", err)
		} else if ctx.Err() == nil {
			c.cfg.Logger.DebugContext(ctx, "inbox lease batch falls back to one lease per message",
				slog.String("consumer", c.cfg.Name), slog.Any("error", err))
		}
		return
	}
	c.db.ok(ctx, "")
	for _, note := range notes {
		note()
	}
	for _, it := range fresh {
		if p := plans[it.ev.EventID]; p != nil {
			it.plan, it.token, it.taken, it.counts = p.plan, p.token, p.taken, p.counts
		}
	}
}

// runLeased is one message's turn: settle it alone, or run its side effect
// under the batch's lease. It returns nil when the message may be finished
// (its result says whether it still needs marking done), errAbandoned or
// errLeaseLost (the key's later messages are then abandoned with it), or a
// *crashError.
func (c *Consumer) runLeased(ctx context.Context, it *leaseItem) error {
	if it.plan == planAlone {
		if err := c.processLeased(ctx, it.d); err != nil {
			it.result = leaseAbandoned
			return err
		}
		it.result = leaseSettled
		return nil
	}
	// Every delivery has its consumer span, a duplicate's too: in lease mode
	// the trace shows each time the third party's payment was considered.
	ctx, span := c.startProcess(ctx, it.d.m, it.ev)
	it.span = span
	switch it.plan {
	case planSettled:
		it.result = leaseSettled
		return nil
	case planRepeat:
		if it.mismatch {
			c.payloadMismatch(ctx, it.ev.EventID)
		}
		it.result = leaseSettled
		return nil
	}
	if err := c.upcast(&it.ev); err != nil {
		it.counts[deadLettered]++
		it.result = leaseSettled
		if err := c.deadLetterLeased(ctx, it.d, &it.ev, err); err != nil {
			it.result = leaseAbandoned
			return err
		}
		return nil
	}
	outcome, settled, err := c.underLease(ctx, it.d, it.ev, it.token, it.taken, &it.counts)
	switch {
	case err != nil:
		it.result = leaseAbandoned
		return err
	case settled:
		it.result = leaseSettled
	default:
		it.result, it.outcome = leaseCalled, outcome
	}
	return nil
}

// renew extends the lease of id if token still holds it.
func (c *Consumer) renew(ctx context.Context, id uuid.UUID, token int64) error {
	tag, err := c.pool.Exec(ctx, renewLease, c.cfg.Name, id, token, c.cfg.LeaseTTL.Microseconds())
	switch {
	case err != nil:
		return dbErrors.Translate("renewing a lease", err)
	case tag.RowsAffected() == 0:
		return errLeaseLost
	}
	return nil
}

// markBatchDone marks every called message done, and runs Effect.Done for
// each, in one transaction. The side effects are behind it, so when that
// transaction fails each message is marked alone, which waits out an
// outage; it returns an error only when the messages must be abandoned
// (ctx ended).
func (c *Consumer) markBatchDone(ctx context.Context, called []*leaseItem) error {
	if len(called) == 0 {
		return nil
	}
	ids, tokens := make([][16]byte, len(called)), make([]int64, len(called))
	for i, it := range called {
		ids[i], tokens[i] = it.ev.EventID, it.token
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, markLeasesDone, c.cfg.Name, ids, tokens)
		if err != nil {
			return dbErrors.Translate("marking leases done", err)
		}
		marked, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
		if err != nil {
			return dbErrors.Translate("marking leases done", err)
		}
		ours := make(map[uuid.UUID]bool, len(marked))
		for _, id := range marked {
			ours[id] = true
		}
		for _, it := range called {
			if !ours[it.ev.EventID] {
				c.leaseTakenOver(ctx, it.ev)
				continue
			}
			if c.effect.Done != nil {
				if err := c.effect.Done(ctx, tx, it.ev, it.outcome); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err == nil {
		c.db.ok(ctx, "")
		return nil
	}
	if isOutage(err) {
		c.db.fail(ctx, "mark_done", err)
	}
	for _, it := range called {
		if err := c.settleLeased(ctx, it.d, "marking done", func() error { return c.markDone(ctx, it.ev, it.token, it.outcome) }); err != nil {
			return err
		}
	}
	return nil
}

func (c *Consumer) leaseTakenOver(ctx context.Context, ev event.Envelope) {
	c.cfg.Logger.WarnContext(ctx, "inbox lease was taken over; leaving the row to the new holder",
		slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()))
}

// The op label of inbox_effect_errors_total.
const (
	opCheck = "check"
	opCall  = "call"
)

// underLease runs ev's side effect under the lease token, retrying with
// backoff, checking first whenever an earlier attempt may have called
// (taken: an expired lease was taken over; or a call of this worker
// failed, since a failed call may still have landed). The other side being
// unavailable (ErrUnavailable) is waited out without counting an attempt.
// It returns the outcome to mark done with; settled when the message needs
// no marking done (marked uncertain, or dead-lettered); errLeaseLost when
// another worker took the message over, errAbandoned, or a *crashError.
func (c *Consumer) underLease(ctx context.Context, d delivery, ev event.Envelope, token int64, taken bool, counts *[numOutcomes]int) (Outcome, bool, error) {
	key := ev.EventID.String()
	mayHaveCalled := taken
	var failedAt time.Time // when this worker's last failed call returned
	c.cfg.Metrics.observeHop(c.cfg.Name, ev.OccurredAt)
	for attempt, outages := 1, 0; ; {
		if !failedAt.IsZero() {
			// That call may still land up to LeaseMargin after it returned;
			// a check any sooner could miss it and call again.
			if err := wait(ctx, d.gen, time.Until(failedAt.Add(c.cfg.LeaseMargin))); err != nil {
				return "", false, err
			}
		}
		outcome, op, err := c.runEffect(ctx, d.gen, ev, token, key, mayHaveCalled)
		if op == opCall && err != nil {
			mayHaveCalled, failedAt = true, time.Now()
		}
		switch {
		case errors.Is(err, errLeaseLost):
			c.leaseTakenOver(ctx, ev)
			return "", false, err
		case errors.Is(err, errAbandoned):
			return "", false, err
		case errors.Is(err, ErrUnknowable):
			c.other.ok(ctx, "")
			return "", true, c.settleLeased(ctx, d, "marking uncertain", func() error { return c.markUncertain(ctx, ev, token, err) })
		case err == nil:
			c.other.ok(ctx, "")
			if c.cfg.CrashPoint != nil {
				if err := c.cfg.CrashPoint(CrashAfterEffect); err != nil {
					return "", false, &crashError{fmt.Errorf("crash point %s: %w", CrashAfterEffect, err)}
				}
			}
			counts[processed]++
			return outcome, false, nil
		case ctx.Err() != nil:
			return "", false, errAbandoned
		case errors.Is(err, ErrUnavailable):
			c.other.fail(ctx, op, err)
			outages++
			if err := wait(ctx, d.gen, retry.Backoff(outages, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
				return "", false, err
			}
			continue
		}
		c.other.ok(ctx, op) // it answered: reachable, and the failure is the message's
		c.cfg.Metrics.failures.WithLabelValues(c.cfg.Name).Inc()
		permanent := isPermanent(err)
		if permanent || attempt >= c.cfg.MaxAttempts {
			if !permanent {
				err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
			}
			counts[deadLettered]++
			return "", true, c.deadLetterLeased(ctx, d, &ev, err)
		}
		delay := retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)
		c.cfg.Logger.WarnContext(ctx, "inbox side effect failed; retrying", slog.String("consumer", c.cfg.Name),
			slog.String("event_id", key), slog.Int("attempt", attempt), slog.Duration("retry_in", delay), slog.Any("error", err))
		if err := wait(ctx, d.gen, delay); err != nil {
			return "", false, err
		}
		attempt++
	}
}

// runEffect checks first when an earlier attempt may have called, then
// calls, each under the lease (callUnderLease). op says which of the two
// the error came from.
func (c *Consumer) runEffect(ctx context.Context, gen *generation, ev event.Envelope, token int64, key string, mayHaveCalled bool) (Outcome, string, error) {
	if mayHaveCalled {
		var has bool
		err := c.callUnderLease(ctx, gen, ev.EventID, token, func(ctx context.Context) (err error) {
			has, err = c.effect.Check(ctx, key)
			return err
		})
		if err != nil {
			return "", opCheck, err
		}
		if has {
			c.cfg.Logger.WarnContext(ctx, "the side effect already happened; marking it done without repeating it",
				slog.String("consumer", c.cfg.Name), slog.String("event_id", key))
			return AlreadyPresent, "", nil
		}
	}
	err := c.callUnderLease(ctx, gen, ev.EventID, token, func(ctx context.Context) error { return c.effect.Call(ctx, ev, key) })
	return Sent, opCall, err
}

// callUnderLease runs f, a call to the other side, only while this worker
// holds the lease of id: it takes one of the MaxInFlight call slots (a wait
// of any length, during which the lease may lapse), renews the lease under
// token, waiting out the database being unreachable, and then runs f with a
// ctx that ends CallTimeout after the renewal began — so before the lease,
// renewed for LeaseTTL, can expire, by LeaseTTL - CallTimeout (at least
// LeaseMargin, which Validate enforces). The renewal is the check: a
// renewal that succeeds late is still safe, since the token proves nobody
// took the message over meanwhile. It returns errLeaseLost when somebody
// did, errAbandoned when ctx ends or gen is dropped, and an error wrapping
// ErrUnavailable when f outlived CallTimeout.
func (c *Consumer) callUnderLease(ctx context.Context, gen *generation, id uuid.UUID, token int64, f func(context.Context) error) error {
	select {
	case c.calls <- struct{}{}:
	case <-ctx.Done():
		return errAbandoned
	}
	defer func() { <-c.calls }()
	var renewed time.Time
	for outages := 1; ; outages++ {
		if gen != nil && gen.isDropped() {
			return errAbandoned
		}
		renewed = time.Now() // before the renewal: the lease runs from no earlier
		err := c.renew(ctx, id, token)
		if err == nil {
			if outages > 1 {
				c.db.ok(ctx, "renew_lease")
			}
			break
		}
		switch {
		case errors.Is(err, errLeaseLost):
			return err
		case ctx.Err() != nil:
			return errAbandoned
		}
		c.db.fail(ctx, "renew_lease", err)
		if err := wait(ctx, gen, retry.Backoff(outages, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
			return err
		}
	}
	callCtx, cancel := context.WithDeadline(ctx, renewed.Add(c.cfg.CallTimeout))
	defer cancel()
	err := f(callCtx)
	if err != nil && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: no answer within CallTimeout (%v): %w", ErrUnavailable, c.cfg.CallTimeout, err)
	}
	return err
}

// effectHealth describes an outage of the Effect's other side, nil when
// there is none or the consumer is not in lease mode.
func (c *Consumer) effectHealth() error {
	if c.other == nil {
		return nil
	}
	return c.other.err()
}
