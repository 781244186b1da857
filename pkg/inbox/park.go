package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
)

// Per-key parking, for both appliers. While a message of an aggregate is
// dead (dead-lettered, not yet requeued and applied), the later messages of
// that aggregate are parked in inbox_parked_messages instead of applied: a
// refund must not reach the third party before its capture. The partition
// moves on for every other aggregate. Once the dead message is requeued and
// applied, its aggregate's parked messages are released in the order they
// arrived, through the same applier as a fetched message (retries, dead
// letters, the version guard), by the worker that applied it.
//
// The dead aggregates are in inbox_dead_keys, one row per dead message,
// written in the dead letter's transaction. A requeue (RequeueDeadLetters)
// marks the row 'requeued' instead of deleting it: the aggregate stays held
// until the requeued message itself is applied, so that a later version
// still in the partition ahead of the requeued copy is parked, not applied.
// The requeued message is applied whatever the version guard says: the
// operator asked for it.

// DeadKeyPolicy says what a consumer does with the later messages of an
// aggregate whose earlier message is dead.
type DeadKeyPolicy int

const (
	// DeadKeyPark parks them until the dead message is requeued and applied,
	// then applies them in order. The default, and the only safe choice
	// when a later event depends on an earlier one (a refund on its capture,
	// a status on the order's creation).
	DeadKeyPark DeadKeyPolicy = iota
	// DeadKeySkipAhead applies them at once, as if the dead message were
	// not there; a requeued dead message is still applied when it comes
	// back, after its successors. For consumers whose events of one
	// aggregate are independent of each other or carry the whole state
	// (a projection that keeps the latest snapshot, notifications, an
	// audit log).
	DeadKeySkipAhead
)

// The SQL of parking. $1 is always the consumer.
const (
	// insertDeadKey holds the dead message's aggregate (in the dead letter's
	// transaction). A message dead-lettered again after a requeue is dead
	// again.
	insertDeadKey = `
INSERT INTO inbox_dead_keys (consumer, message_id, aggregate_type, aggregate_id, aggregate_version)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, message_id) DO UPDATE SET status = 'dead', dead_at = now(), requeued_at = NULL`

	// unreserveVersion moves the version guard back below a dead message
	// (park mode): the lease applier advances it when it leases, before the
	// effect, and the later versions it leased with it are parked, so none
	// of them is applied.
	unreserveVersion = `
UPDATE inbox_aggregate_versions SET version = $4 - 1, updated_at = now()
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version >= $4`

	// parkState reads what decides a message's fate: its own hold's status
	// (a requeued dead message), whether another message holds its
	// aggregate, the first parked message of its aggregate, and whether it
	// is parked itself.
	parkState = `
SELECT (SELECT status FROM inbox_dead_keys WHERE consumer = $1 AND message_id = $4),
       EXISTS (SELECT 1 FROM inbox_dead_keys
               WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND message_id <> $4),
       (SELECT message_id FROM inbox_parked_messages
        WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 ORDER BY seq LIMIT 1),
       (SELECT message_id FROM inbox_dead_keys
        WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND message_id <> $4
        ORDER BY aggregate_version, dead_at LIMIT 1)`

	// keysHeld returns which of the given aggregates have a dead message or
	// parked messages: a batch that meets one settles message by message.
	keysHeld = `
SELECT k.t, k.i FROM unnest($2::text[], $3::text[]) AS k(t, i)
WHERE EXISTS (SELECT 1 FROM inbox_dead_keys d WHERE d.consumer = $1 AND d.aggregate_type = k.t AND d.aggregate_id = k.i)
   OR EXISTS (SELECT 1 FROM inbox_parked_messages p WHERE p.consumer = $1 AND p.aggregate_type = k.t AND p.aggregate_id = k.i)`

	// dropDeadKey releases the aggregate of a requeued message once it is
	// applied.
	dropDeadKey = `DELETE FROM inbox_dead_keys WHERE consumer = $1 AND message_id = $2`

	insertParked = `
INSERT INTO inbox_parked_messages (consumer, message_id, aggregate_type, aggregate_id, aggregate_version, event_type,
                                   blocked_by, topic, kafka_partition, kafka_offset, msg_key, msg_value, msg_headers)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (consumer, message_id) DO NOTHING`

	// nextParked is the first parked message of an aggregate, unless a
	// dead message holds the aggregate (again); with whether this
	// consumer's inbox has settled it already.
	nextParked = `
SELECT p.message_id, p.topic, p.kafka_partition, p.kafka_offset, p.msg_key, p.msg_value, p.msg_headers,
       EXISTS (SELECT 1 FROM inbox_messages i WHERE i.consumer = p.consumer AND i.message_id = p.message_id
               AND i.status IN ('processed', 'stale', 'dead_lettered', 'uncertain'))
FROM inbox_parked_messages p
WHERE p.consumer = $1 AND p.aggregate_type = $2 AND p.aggregate_id = $3
  AND NOT EXISTS (SELECT 1 FROM inbox_dead_keys d WHERE d.consumer = $1 AND d.aggregate_type = $2 AND d.aggregate_id = $3)
ORDER BY p.seq LIMIT 1`

	deleteParked = `DELETE FROM inbox_parked_messages WHERE consumer = $1 AND message_id = $2`

	countParked = `SELECT count(*) FROM inbox_parked_messages WHERE consumer = $1`
)

// verdict is what parking decided for a message that has no inbox row yet.
type verdict int

const (
	proceed         verdict = iota // nothing held: apply it as usual
	proceedRequeued                // the requeued dead message: apply it, whatever the guard says, and drop its hold
	proceedReleased                // the first parked message of its aggregate: apply it
	parkIt                         // park it behind its aggregate's dead or parked messages
	alreadyParked                  // a redelivery of a message parked already: nothing to do
)

// parkDecision is parkCheck's answer.
type parkDecision struct {
	verdict   verdict
	blockedBy *uuid.UUID // parkIt: the dead message it waits for, if any
	release   bool       // the aggregate has parked messages to release after the batch
}

// parkCheck decides ev's fate in tx. A consumer that skips ahead only
// recognizes a requeued dead message.
func (c *Consumer) parkCheck(ctx context.Context, tx pgx.Tx, ev *event.Envelope) (parkDecision, error) {
	var (
		own         *string
		otherDead   bool
		firstParked *uuid.UUID
		deadOne     *uuid.UUID
	)
	if err := tx.QueryRow(ctx, parkState, c.cfg.Name, ev.AggregateType, ev.AggregateID, ev.EventID).
		Scan(&own, &otherDead, &firstParked, &deadOne); err != nil {
		return parkDecision{}, dbErrors.Translate("reading the aggregate's parking", err)
	}
	switch {
	case own != nil:
		return parkDecision{verdict: proceedRequeued, release: firstParked != nil}, nil
	case c.cfg.DeadKeys == DeadKeySkipAhead:
		return parkDecision{verdict: proceed}, nil
	case otherDead:
		return parkDecision{verdict: parkIt, blockedBy: deadOne}, nil
	case firstParked == nil:
		return parkDecision{verdict: proceed}, nil
	case *firstParked == ev.EventID:
		return parkDecision{verdict: proceedReleased, release: true}, nil
	}
	// Parked messages wait ahead of it: whether it is one of them or not,
	// it goes after them, and they may be released now.
	var parked bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inbox_parked_messages WHERE consumer = $1 AND message_id = $2)`,
		c.cfg.Name, ev.EventID).Scan(&parked); err != nil {
		return parkDecision{}, dbErrors.Translate("reading the aggregate's parking", err)
	}
	if parked {
		return parkDecision{verdict: alreadyParked, release: true}, nil
	}
	return parkDecision{verdict: parkIt, release: true}, nil
}

// storedHeader is one Kafka header of a parked message, as msg_headers
// keeps it: both fields base64 (json's []byte), since neither needs to be
// valid UTF-8 nor free of NUL bytes, which jsonb refuses.
type storedHeader struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

// park stores m, whole, in inbox_parked_messages.
func (c *Consumer) park(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, blockedBy *uuid.UUID) error {
	hs := make([]storedHeader, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = storedHeader{Key: []byte(h.Key), Value: h.Value}
	}
	headers, err := json.Marshal(hs)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, insertParked, c.cfg.Name, ev.EventID, ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
		ev.EventType, blockedBy, m.Topic, m.Partition, m.Offset, m.Key, m.Value, headers); err != nil {
		return dbErrors.Translate("parking a message", err)
	}
	c.cfg.Logger.WarnContext(ctx, "inbox parked a message behind a dead one of its aggregate",
		slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()),
		slog.String("aggregate_id", ev.AggregateID), slog.Int64("version", ev.AggregateVersion))
	return nil
}

// holdDeadKey records, in the dead letter's transaction, that ev is dead.
// In lease mode, when parking, it also moves the version guard back below
// it: the guard advanced when ev was leased. (The transactional applier's
// guard advanced in ev's savepoint, rolled back with its failure.)
func (c *Consumer) holdDeadKey(ctx context.Context, tx pgx.Tx, ev *event.Envelope) error {
	if _, err := tx.Exec(ctx, insertDeadKey, c.cfg.Name, ev.EventID, ev.AggregateType, ev.AggregateID, ev.AggregateVersion); err != nil {
		return err
	}
	if c.cfg.DeadKeys == DeadKeyPark && !c.cfg.DisableVersionGuard && c.effect != nil {
		if _, err := tx.Exec(ctx, unreserveVersion, c.cfg.Name, ev.AggregateType, ev.AggregateID, ev.AggregateVersion); err != nil {
			return err
		}
	}
	return nil
}

// heldKeys returns the aggregates of evs that are held (a dead message or
// parked messages): the batch appliers leave their messages to the
// one-by-one path, which decides each with parkCheck.
func (c *Consumer) heldKeys(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, evs []event.Envelope) (map[aggregateKey]bool, error) {
	typs, ids := make([]string, 0, len(evs)), make([]string, 0, len(evs))
	seen := map[aggregateKey]bool{}
	for _, ev := range evs {
		k := aggregateKey{ev.AggregateType, ev.AggregateID}
		if !seen[k] {
			seen[k] = true
			typs, ids = append(typs, k.typ), append(ids, k.id)
		}
	}
	rows, err := q.Query(ctx, keysHeld, c.cfg.Name, typs, ids)
	if err != nil {
		return nil, dbErrors.Translate("reading held aggregates", err)
	}
	held := map[aggregateKey]bool{}
	var k aggregateKey
	if _, err := pgx.ForEachRow(rows, []any{&k.typ, &k.id}, func() error { held[k] = true; return nil }); err != nil {
		return nil, dbErrors.Translate("reading held aggregates", err)
	}
	return held, nil
}

// releases is the set of aggregates whose parked messages may be released
// once the batch that found them is settled; the worker that handled the
// batch releases them (releaseParked).
type releases struct {
	mu   sync.Mutex
	keys map[aggregateKey]bool
}

func (r *releases) add(k aggregateKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = map[aggregateKey]bool{}
	}
	r.keys[k] = true
}

// take removes k and reports whether it was there.
func (r *releases) take(k aggregateKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.keys[k] {
		return false
	}
	delete(r.keys, k)
	return true
}

// releaseParked runs, after batch is settled, the parked messages of the
// batch's aggregates that may go now, one at a time in the order they were
// parked, through process (the applier), under the generation of the
// aggregate's last message in the batch. A released message that is
// settled (applied, stale, dead-lettered, uncertain) leaves the parking; one
// that is not (its generation was dropped, the shutdown grace ended) stays
// parked first, and the aggregate's next message releases it.
func (c *Consumer) releaseParked(ctx context.Context, batch []delivery, process func(context.Context, []delivery) error) error {
	type target struct {
		k   aggregateKey
		gen *generation
	}
	var targets []target
	idx := map[aggregateKey]int{}
	for _, d := range batch {
		ev, err := event.FromKafka(d.m)
		if err != nil {
			continue
		}
		k := aggregateKey{ev.AggregateType, ev.AggregateID}
		if i, ok := idx[k]; ok {
			targets[i].gen = d.gen
			continue
		}
		idx[k] = len(targets)
		targets = append(targets, target{k, d.gen})
	}
	for _, tg := range targets {
		if !c.released.take(tg.k) {
			continue
		}
		for ctx.Err() == nil && (tg.gen == nil || !tg.gen.isDropped()) {
			m, settled, ok, err := c.nextParked(ctx, tg.k)
			if err != nil {
				if isOutage(err) {
					c.db.fail(ctx, "release_parked", err)
				}
				c.cfg.Logger.WarnContext(ctx, "inbox could not read its parked messages; the aggregate's next message releases them",
					slog.String("consumer", c.cfg.Name), slog.String("aggregate_id", tg.k.id), slog.Any("error", err))
				break
			}
			if !ok {
				break
			}
			if !settled {
				if err := process(ctx, []delivery{{m: m, gen: tg.gen.released()}}); err != nil {
					return err
				}
				if settled, err = c.inboxSettled(ctx, m); err != nil || !settled {
					break // abandoned: it stays first in the parking
				}
			}
			if _, err := c.pool.Exec(ctx, deleteParked, c.cfg.Name, parkedID(m)); err != nil {
				break
			}
			c.cfg.Metrics.released.WithLabelValues(c.cfg.Name).Inc()
		}
	}
	return nil
}

// nextParked reads the first parked message of k, as it was fetched;
// settled when the inbox already settled it (released before a crash).
func (c *Consumer) nextParked(ctx context.Context, k aggregateKey) (m kafka.Message, settled, ok bool, err error) {
	var (
		id      uuid.UUID
		headers []byte
	)
	err = c.pool.QueryRow(ctx, nextParked, c.cfg.Name, k.typ, k.id).
		Scan(&id, &m.Topic, &m.Partition, &m.Offset, &m.Key, &m.Value, &headers, &settled)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, false, false, nil
	}
	if err != nil {
		return m, false, false, dbErrors.Translate("reading a parked message", err)
	}
	if m.Headers, err = decodeHeaders(headers); err != nil {
		return m, false, false, fmt.Errorf("parked message %s: its headers: %w", id, err)
	}
	return m, settled, true, nil
}

// inboxSettled reports whether the inbox settled m for good.
func (c *Consumer) inboxSettled(ctx context.Context, m kafka.Message) (bool, error) {
	var settled bool
	err := c.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inbox_messages WHERE consumer = $1 AND message_id = $2
		AND status IN ('processed', 'stale', 'dead_lettered', 'uncertain'))`, c.cfg.Name, parkedID(m)).Scan(&settled)
	return settled, err
}

// parkedID is the event id of a message read back from the parking, whose
// envelope decoded when it was parked.
func parkedID(m kafka.Message) uuid.UUID {
	ev, _ := event.FromKafka(m)
	return ev.EventID
}

// unheld returns the items of fresh whose aggregates are not held.
func (c *Consumer) unheld(ctx context.Context, tx pgx.Tx, fresh []*leaseItem) ([]*leaseItem, error) {
	evs := make([]event.Envelope, len(fresh))
	for i, it := range fresh {
		evs[i] = it.ev
	}
	held, err := c.heldKeys(ctx, tx, evs)
	if err != nil || len(held) == 0 {
		return fresh, err
	}
	out := make([]*leaseItem, 0, len(fresh))
	for _, it := range fresh {
		if !held[aggregateKey{it.ev.AggregateType, it.ev.AggregateID}] {
			out = append(out, it)
		}
	}
	return out, nil
}

// deleteLease removes the inbox row of a message leased with its batch, if
// the lease is still this worker's, to park the message instead.
const deleteLease = `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`

// parkLeasedIfHeld parks a message the batch leased when an earlier
// message of its aggregate died after the batch's lease transaction (its
// call failed for good): the lease is given up and the message parked.
// It reports whether it parked it; an error abandons it.
func (c *Consumer) parkLeasedIfHeld(ctx context.Context, it *leaseItem) (bool, error) {
	var parkedNow bool
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		parkedNow = false
		pd, err := c.parkCheck(ctx, tx, &it.ev)
		if err != nil || pd.verdict != parkIt {
			return err
		}
		tag, err := tx.Exec(ctx, deleteLease, c.cfg.Name, it.ev.EventID, it.token)
		if err != nil {
			return dbErrors.Translate("parking a leased message", err)
		}
		if tag.RowsAffected() == 0 {
			return nil // taken over: its new holder decides
		}
		parkedNow = true
		return c.park(ctx, tx, it.d.m, &it.ev, pd.blockedBy)
	})
	if err != nil {
		if isOutage(err) {
			c.db.fail(ctx, "park", err)
		}
		return false, err
	}
	if parkedNow {
		it.counts[parked]++
	}
	return parkedNow, nil
}

// Parked is one message held behind a dead message of its aggregate, as
// ListParked shows it to an operator.
type Parked struct {
	Consumer         string
	EventID          uuid.UUID
	EventType        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// BlockedBy is the dead message it was parked behind; zero when it was
	// parked behind earlier parked messages being released.
	BlockedBy uuid.UUID
	// Topic, Partition and Offset are where it was fetched.
	Topic     string
	Partition int
	Offset    int64
	ParkedAt  time.Time
}

// ParkedFilter selects what ListParked lists. The zero value lists the
// oldest 100 parked messages of every consumer.
type ParkedFilter struct {
	// Consumer restricts the list to one consumer (Config.Name).
	Consumer string
	// AggregateID restricts it to one aggregate.
	AggregateID string
	// Limit is the most messages listed, from 1 to 1000; 0 means 100.
	Limit int
}

const listParked = `
SELECT consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
       coalesce(blocked_by, '00000000-0000-0000-0000-000000000000'), topic, kafka_partition, kafka_offset, parked_at
FROM inbox_parked_messages
WHERE ($1 = '' OR consumer = $1) AND ($2 = '' OR aggregate_id = $2)
ORDER BY consumer, aggregate_type, aggregate_id, seq
LIMIT $3`

// ListParked lists parked messages, each aggregate's in the order they will
// be released. Reads only: a read-only role may run it. They leave the
// parking when the dead message of their aggregate is requeued (see
// RequeueDeadLetters) and applied.
func ListParked(ctx context.Context, db BacklogDB, f ParkedFilter) ([]Parked, error) {
	if f.Limit < 0 || f.Limit > 1000 {
		return nil, fmt.Errorf("inbox: ListParked: the limit must be from 1 to 1000 (0: 100), not %d", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	rows, err := db.Query(ctx, listParked, f.Consumer, f.AggregateID, f.Limit)
	if err != nil {
		return nil, dbErrors.Translate("inbox: listing parked messages", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		err := r.Scan(&p.Consumer, &p.EventID, &p.EventType, &p.AggregateType, &p.AggregateID, &p.AggregateVersion,
			&p.BlockedBy, &p.Topic, &p.Partition, &p.Offset, &p.ParkedAt)
		return p, err
	})
	if err != nil {
		return nil, dbErrors.Translate("inbox: listing parked messages", err)
	}
	return out, nil
}

// firstParkedOfFreeKeys is, per aggregate parked in the given partitions of
// topic with no dead message ahead, its first parked message.
const firstParkedOfFreeKeys = `
SELECT DISTINCT ON (p.aggregate_type, p.aggregate_id)
       p.message_id, p.topic, p.kafka_partition, p.kafka_offset, p.msg_key, p.msg_value, p.msg_headers
FROM inbox_parked_messages p
WHERE p.consumer = $1 AND p.topic = $2 AND p.kafka_partition = ANY($3)
  AND NOT EXISTS (SELECT 1 FROM inbox_dead_keys d
                  WHERE d.consumer = p.consumer AND d.aggregate_type = p.aggregate_type AND d.aggregate_id = p.aggregate_id)
ORDER BY p.aggregate_type, p.aggregate_id, p.seq`

// resumeReleases hands the workers, when a generation starts, the first
// parked message of every aggregate of its partitions that nothing dead
// holds any more: a consumer that stopped after applying a requeued
// message, before releasing what was parked behind it, left them so. Each
// is handled as a released message (its key's worker applies it, then
// releases the rest); a failure to read them is logged, and the next
// generation, or the aggregate's next message, tries again.
func (c *Consumer) resumeReleases(ctx context.Context, g *generation, assigned map[partitionKey]int64,
	dispatch func(context.Context, delivery) bool) {
	var parts []int32
	for k := range assigned {
		if k.topic == c.group.Topic {
			parts = append(parts, int32(k.partition))
		}
	}
	if len(parts) == 0 {
		return
	}
	rows, err := c.pool.Query(ctx, firstParkedOfFreeKeys, c.cfg.Name, c.group.Topic, parts)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.WarnContext(ctx, "inbox could not look for parked messages to release",
				slog.String("consumer", c.cfg.Name), slog.Any("error", err))
		}
		return
	}
	var ms []kafka.Message
	for rows.Next() {
		var (
			m       kafka.Message
			id      uuid.UUID
			headers []byte
		)
		if err := rows.Scan(&id, &m.Topic, &m.Partition, &m.Offset, &m.Key, &m.Value, &headers); err != nil {
			break
		}
		if m.Headers, err = decodeHeaders(headers); err != nil {
			continue
		}
		ms = append(ms, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil && ctx.Err() == nil {
		c.cfg.Logger.WarnContext(ctx, "inbox could not look for parked messages to release",
			slog.String("consumer", c.cfg.Name), slog.Any("error", err))
	}
	for _, m := range ms {
		if !dispatch(ctx, delivery{m: m, gen: g.released()}) {
			return
		}
	}
}

func decodeHeaders(raw []byte) ([]kafka.Header, error) {
	var hs []storedHeader
	if err := json.Unmarshal(raw, &hs); err != nil {
		return nil, err
	}
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: string(h.Key), Value: h.Value}
	}
	return out, nil
}
