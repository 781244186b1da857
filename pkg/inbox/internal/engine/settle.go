// What both appliers settle a message with: the version guard (upcasters,
// payload checks, gaps and stale versions) and the parking of an aggregate
// behind its dead message.

package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"
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

// The SQL of parking. $1 is always the consumer.
const (
	// parkState reads what decides a message's fate: its own hold's status
	// (a requeued dead message), whether another message holds its
	// aggregate, the first parked message of its aggregate, and whether it
	// is parked itself. Only what comes before a message holds it: a dead
	// message or a parked one of a lower version, or of an unknown one (0).
	// An earlier version arriving after a later one died (the later one was
	// refused because it needs the earlier one, say) is applied, or the two
	// would wait for each other.
	parkState = `
SELECT (SELECT status FROM inbox_dead_keys WHERE consumer = $1 AND message_id = $4),
       EXISTS (SELECT 1 FROM inbox_dead_keys
               WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND message_id <> $4
                 AND NOT ($5 > 0 AND aggregate_version > $5)),
       (SELECT message_id FROM inbox_parked_messages
        WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
          AND NOT ($5 > 0 AND aggregate_version > $5)
        ORDER BY seq LIMIT 1),
       (SELECT message_id FROM inbox_dead_keys
        WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND message_id <> $4
          AND NOT ($5 > 0 AND aggregate_version > $5)
        ORDER BY aggregate_version, dead_at LIMIT 1),
       EXISTS (SELECT 1 FROM inbox_parked_messages WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3)`

	// keysHeld returns which of the given aggregates have a dead message or
	// parked messages: a batch that meets one settles message by message.
	keysHeld = `
SELECT k.t, k.i FROM unnest($2::text[], $3::text[]) AS k(t, i)
WHERE EXISTS (SELECT 1 FROM inbox_dead_keys d WHERE d.consumer = $1 AND d.aggregate_type = k.t AND d.aggregate_id = k.i)
   OR EXISTS (SELECT 1 FROM inbox_parked_messages p WHERE p.consumer = $1 AND p.aggregate_type = k.t AND p.aggregate_id = k.i)`

	// nextParked is the first parked message of an aggregate, unless a
	// dead message holds the aggregate (again); with whether this
	// consumer's inbox has settled it already.
	nextParked = `
SELECT p.message_id, p.topic, p.kafka_partition, p.kafka_offset, p.msg_key, p.msg_value, p.msg_headers,
       EXISTS (SELECT 1 FROM inbox_messages i WHERE i.consumer = p.consumer AND i.message_id = p.message_id
               AND i.status IN ('processed', 'stale', 'dead_lettered', 'uncertain', 'skipped'))
FROM inbox_parked_messages p
WHERE p.consumer = $1 AND p.aggregate_type = $2 AND p.aggregate_id = $3
  AND NOT EXISTS (SELECT 1 FROM inbox_dead_keys d WHERE d.consumer = $1 AND d.aggregate_type = $2 AND d.aggregate_id = $3)
ORDER BY p.seq LIMIT 1`

	countParked = `SELECT count(*) FROM inbox_parked_messages WHERE consumer = $1`
)

// verdict is what parking decided for a message whose inbox row its
// transaction just took: a new row (record, lease), or a requeued one
// (reapply, reclaim). A requeued row is not always known by its hold: a
// stale dead letter holds nothing, so its requeue meets parkIt when an
// earlier dead message holds its aggregate; it is then parked with its row
// put back requeued (tRepark), never deleted, and its release reapplies it.
type verdict int

const (
	proceed         verdict = iota // nothing held: apply it as usual
	ProceedRequeued                // the requeued dead message: apply it, whatever the guard says, and drop its hold
	proceedReleased                // the first parked message of its aggregate: apply it
	ParkIt                         // park it behind its aggregate's dead or parked messages
	AlreadyParked                  // a redelivery of a message parked already: nothing to do
)

// parkDecision is parkCheck's answer.
type parkDecision struct {
	Verdict   verdict
	BlockedBy *uuid.UUID // ParkIt: the dead message it waits for, if any
	Release   bool       // the aggregate has parked messages to release after the batch
}

// ParkCheck decides ev's fate in tx. It knows a requeued dead message by
// its hold (proceedRequeued); a stale dead letter's requeue, which holds
// nothing, gets the verdict of a new message, and the caller, which knows
// it by its row, keeps that row (tRepark) if it parks it. A consumer that
// skips ahead only recognizes a requeued dead message.
func (s *Shared) ParkCheck(ctx context.Context, tx pgx.Tx, ev *event.Envelope) (parkDecision, error) {
	var (
		own         *string
		otherDead   bool
		firstParked *uuid.UUID
		deadOne     *uuid.UUID
		anyParked   bool
	)
	if err := tx.QueryRow(ctx, parkState, s.Config.Name, ev.AggregateType, ev.AggregateID, ev.EventID, ev.AggregateVersion).
		Scan(&own, &otherDead, &firstParked, &deadOne, &anyParked); err != nil {
		return parkDecision{}, DBErrors.Translate("reading the aggregate's parking", err)
	}
	switch {
	case own != nil:
		return parkDecision{Verdict: ProceedRequeued, Release: anyParked}, nil
	case s.Config.SkipAheadOfDead:
		return parkDecision{Verdict: proceed}, nil
	case otherDead:
		return parkDecision{Verdict: ParkIt, BlockedBy: deadOne}, nil
	case firstParked == nil:
		return parkDecision{Verdict: proceed}, nil
	case *firstParked == ev.EventID:
		return parkDecision{Verdict: proceedReleased, Release: true}, nil
	}
	// Parked messages wait ahead of it: whether it is one of them or not,
	// it goes after them, and they may be released now.
	var parked bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inbox_parked_messages WHERE consumer = $1 AND message_id = $2)`,
		s.Config.Name, ev.EventID).Scan(&parked); err != nil {
		return parkDecision{}, DBErrors.Translate("reading the aggregate's parking", err)
	}
	if parked {
		return parkDecision{Verdict: AlreadyParked, Release: true}, nil
	}
	return parkDecision{Verdict: ParkIt, Release: true}, nil
}

// Park stores m, whole, in inbox_parked_messages.
func (s *Shared) Park(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, blockedBy *uuid.UUID) error {
	headers, err := dlt.EncodeHeaders(m.Headers)
	if err != nil {
		return err
	}
	if _, err := state.Take(ctx, tx, &state.Park, s.Config.Name, ev.EventID, ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
		ev.EventType, blockedBy, m.Topic, m.Partition, m.Offset, m.Key, m.Value, headers); err != nil {
		return DBErrors.Translate("parking a message", err)
	}
	s.Config.Logger.WarnContext(ctx, "inbox parked a message behind a dead one of its aggregate",
		slog.String("consumer", s.Config.Name), slog.String("event_id", ev.EventID.String()),
		slog.String("aggregate_id", ev.AggregateID), slog.Int64("version", ev.AggregateVersion))
	return nil
}

// holdDeadKey records, in the dead letter's transaction, that ev is dead.
// When parking, and the applier reserves versions (the lease applier: the
// guard advanced when ev was leased), it also moves the version guard back
// below it. (The transactional applier's guard advanced in ev's savepoint,
// rolled back with its failure.)
func (s *Shared) holdDeadKey(ctx context.Context, tx pgx.Tx, ev *event.Envelope) error {
	if _, err := state.Take(ctx, tx, &state.Hold, s.Config.Name, ev.EventID, ev.AggregateType, ev.AggregateID, ev.AggregateVersion); err != nil {
		return err
	}
	if !s.Config.SkipAheadOfDead && !s.Config.DisableVersionGuard && s.ReservesVersions {
		if _, err := state.Take(ctx, tx, &state.Unreserve, s.Config.Name, ev.AggregateType, ev.AggregateID, ev.AggregateVersion); err != nil {
			return err
		}
	}
	return nil
}

// HeldKeys returns the aggregates of evs that are held (a dead message or
// parked messages): the batch appliers leave their messages to the
// one-by-one path, which decides each with parkCheck.
func (s *Shared) HeldKeys(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, evs []event.Envelope) (map[AggregateKey]bool, error) {
	typs, ids := make([]string, 0, len(evs)), make([]string, 0, len(evs))
	seen := map[AggregateKey]bool{}
	for _, ev := range evs {
		k := AggregateKey{ev.AggregateType, ev.AggregateID}
		if !seen[k] {
			seen[k] = true
			typs, ids = append(typs, k.Type), append(ids, k.ID)
		}
	}
	rows, err := q.Query(ctx, keysHeld, s.Config.Name, typs, ids)
	if err != nil {
		return nil, DBErrors.Translate("reading held aggregates", err)
	}
	held := map[AggregateKey]bool{}
	var k AggregateKey
	if _, err := pgx.ForEachRow(rows, []any{&k.Type, &k.ID}, func() error { held[k] = true; return nil }); err != nil {
		return nil, DBErrors.Translate("reading held aggregates", err)
	}
	return held, nil
}

// releases is the set of aggregates whose parked messages may be released
// once the batch that found them is settled; the worker that handled the
// batch releases them (releaseParked).
type releases struct {
	mu   sync.Mutex
	keys map[AggregateKey]bool
}

func (r *releases) Add(k AggregateKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = map[AggregateKey]bool{}
	}
	r.keys[k] = true
}

// empty reports whether no aggregate waits for its release, which is
// nearly always: releaseParked then reads no envelope again.
func (r *releases) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys) == 0
}

// take removes k and reports whether it was there.
func (r *releases) take(k AggregateKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.keys[k] {
		return false
	}
	delete(r.keys, k)
	return true
}

type AggregateKey struct{ Type, ID string }

const lockVersions = `
SELECT v.aggregate_type, v.aggregate_id, v.version
FROM inbox_aggregate_versions v
JOIN unnest($2::text[], $3::text[]) AS a(aggregate_type, aggregate_id)
  ON v.aggregate_type = a.aggregate_type AND v.aggregate_id = a.aggregate_id
WHERE v.consumer = $1
FOR UPDATE OF v`

// GuardBatch is guardVersion for a batch: it marks stale messages in outs
// (and in the inbox), advances each aggregate's version once, and returns
// the log lines and gap counts to emit once the transaction commits. A gap
// (unless AcceptGaps), and a stale event (unless SkipStale), is an error: the
// message-by-message path settles it (a retry, a dead letter).
func (s *Shared) GuardBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, outs []Outcome) ([]func(), error) {
	var keys []AggregateKey
	want := map[AggregateKey]bool{}
	for i, ev := range evs {
		k := AggregateKey{ev.AggregateType, ev.AggregateID}
		if outs[i] == Processed && !want[k] {
			want[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	typs, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		typs[i], ids[i] = k.Type, k.ID
	}
	rows, err := tx.Query(ctx, lockVersions, s.Config.Name, typs, ids)
	if err != nil {
		return nil, err
	}
	applied := map[AggregateKey]int64{}
	var k AggregateKey
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&k.Type, &k.ID, &v}, func() error { applied[k] = v; return nil }); err != nil {
		return nil, err
	}

	var notes []func()
	var staleIDs []uuid.UUID
	for i, ev := range evs {
		if outs[i] != Processed {
			continue
		}
		k := AggregateKey{ev.AggregateType, ev.AggregateID}
		prev, known := applied[k]
		switch {
		case !known || ev.AggregateVersion == prev+1:
		case ev.AggregateVersion <= prev && !s.Config.SkipStale:
			return nil, &staleError{version: ev.AggregateVersion, applied: prev}
		case ev.AggregateVersion <= prev:
			outs[i] = Stale
			staleIDs = append(staleIDs, ev.EventID)
			notes = append(notes, func() {
				s.Config.Logger.InfoContext(ctx, "inbox skipped a stale event", slog.String("consumer", s.Config.Name),
					slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
					slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", prev))
			})
			continue
		default: // a gap
			if !s.Config.AcceptGaps {
				return nil, fmt.Errorf("aggregate %s: version %d follows %d", ev.AggregateID, ev.AggregateVersion, prev)
			}
			notes = append(notes, func() {
				s.Config.Metrics.gaps.WithLabelValues(s.Config.Name).Inc()
				s.Config.Logger.WarnContext(ctx, "inbox sees a version gap", slog.String("consumer", s.Config.Name),
					slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
					slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", prev))
			})
		}
		applied[k] = ev.AggregateVersion
	}
	for i, k := range keys {
		typs[i], ids[i] = k.Type, k.ID
	}
	versions := make([]int64, len(keys))
	for i, k := range keys {
		versions[i] = applied[k]
	}
	if _, err := state.Take(ctx, tx, &state.Advance, s.Config.Name, typs, ids, versions); err != nil {
		return nil, err
	}
	if len(staleIDs) > 0 {
		if _, err := state.Take(ctx, tx, &state.Stale, s.Config.Name, staleIDs, s.recordedState()); err != nil {
			return nil, err
		}
	}
	return notes, nil
}

// payloadMismatches returns which of the given redelivered events carry a
// payload other than the one first recorded (payload_hash, the sha256 the
// inbox stores with every row).
const payloadMismatches = `
SELECT m.id
FROM unnest($2::uuid[], $3::bytea[]) AS m(id, payload)
JOIN inbox_messages i ON i.consumer = $1 AND i.message_id = m.id
WHERE i.payload_hash <> sha256(m.payload)`

// CheckPayloads compares redelivered events with the payload their inbox row
// recorded. A mismatch is a producer bug — one event id reused for another
// body — that dedupe would otherwise hide: the redelivery is still a no-op
// (the first body was applied), but it is logged and counted in
// inbox_payload_mismatches_total. It costs a query only when there are
// duplicates.
func (s *Shared) CheckPayloads(ctx context.Context, tx pgx.Tx, dups ...event.Envelope) error {
	if len(dups) == 0 {
		return nil
	}
	ids, payloads := make([][16]byte, len(dups)), make([][]byte, len(dups))
	for i, ev := range dups {
		ids[i], payloads[i] = ev.EventID, []byte(ev.Payload)
	}
	rows, err := tx.Query(ctx, payloadMismatches, s.Config.Name, ids, payloads)
	if err != nil {
		return DBErrors.Translate("comparing payloads of duplicates", err)
	}
	bad, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return DBErrors.Translate("comparing payloads of duplicates", err)
	}
	for _, id := range bad {
		s.PayloadMismatch(ctx, id)
	}
	return nil
}

// PayloadMismatch counts and logs a duplicate of id with another payload.
func (s *Shared) PayloadMismatch(ctx context.Context, id uuid.UUID) {
	s.Config.Metrics.payloadMismatches.WithLabelValues(s.Config.Name).Inc()
	s.Config.Logger.WarnContext(ctx, "inbox duplicate with another payload: the producer reused an event id; the first payload was applied, this one ignored",
		slog.String("consumer", s.Config.Name), slog.String("event_id", id.String()))
}

// GuardVersion reports whether ev is stale (at or below the version this
// consumer applied last for its aggregate) and reports gaps. A requeued
// dead message is never stale: an operator sent it back to be applied (a
// consumer that skips ahead applied its successors meanwhile).
func (s *Shared) GuardVersion(ctx context.Context, tx pgx.Tx, ev *event.Envelope, requeued bool) (bool, error) {
	var prev *int64
	if err := tx.QueryRow(ctx, state.AdvanceOne.SQL, s.Config.Name, ev.AggregateType, ev.AggregateID, ev.AggregateVersion).Scan(&prev); err != nil {
		return false, DBErrors.Translate("checking the aggregate version", err)
	}
	switch {
	case prev == nil:
		return false, nil
	case ev.AggregateVersion <= *prev && requeued:
		s.Config.Logger.InfoContext(ctx, "inbox applies a requeued event below the applied version", slog.String("consumer", s.Config.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", *prev))
		return false, nil
	case ev.AggregateVersion <= *prev && !s.Config.SkipStale:
		s.Config.Logger.WarnContext(ctx, "inbox dead-letters a stale event: an older version arrived after a newer one was applied",
			slog.String("consumer", s.Config.Name), slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", *prev))
		return false, &staleError{version: ev.AggregateVersion, applied: *prev}
	case ev.AggregateVersion <= *prev:
		if _, err := state.Take(ctx, tx, &state.Stale, s.Config.Name, []uuid.UUID{ev.EventID}, s.recordedState()); err != nil {
			return false, err
		}
		s.Config.Logger.InfoContext(ctx, "inbox skipped a stale event", slog.String("consumer", s.Config.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", *prev))
		return true, nil
	case ev.AggregateVersion > *prev+1:
		s.Config.Metrics.gaps.WithLabelValues(s.Config.Name).Inc()
		s.Config.Logger.WarnContext(ctx, "inbox sees a version gap", slog.String("consumer", s.Config.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("version", ev.AggregateVersion), slog.Int64("applied_version", *prev))
		if !s.Config.AcceptGaps {
			return false, fmt.Errorf("aggregate %s: version %d follows %d; waiting for the missing ones",
				ev.AggregateID, ev.AggregateVersion, *prev)
		}
	}
	return false, nil
}

// recordedState is the state the applier's transaction gives a message's
// row before the version guard looks at it: leased by the lease applier,
// processed by the transactional one.
func (s *Shared) recordedState() string {
	if s.ReservesVersions {
		return state.StatusLeased
	}
	return state.StatusProcessed
}

// staleError is the dead-letter reason of an event at or below the
// version its aggregate already applied (SkipStale false). It is permanent
// (no retry makes it newer), and it holds nothing back: the dead letter of
// an older event must not park the newer ones (recordDeadLetter).
type staleError struct{ version, applied int64 }

func (e *staleError) Error() string {
	return fmt.Sprintf("stale: version %d arrived after version %d was applied", e.version, e.applied)
}

func (e *staleError) Unwrap() error { return ErrPermanent }

// isStale reports whether a dead letter's reason is a staleError.
func isStale(reason error) bool {
	var se *staleError
	return errors.As(reason, &se)
}

// Upcast converts ev's payload to the newest version it has upcasters for.
func (s *Shared) Upcast(ev *event.Envelope) error {
	for {
		u, ok := s.upcasters[ev.EventType][ev.EventVersion]
		if !ok {
			return nil
		}
		p, err := u.Convert(ev.Payload)
		if err != nil {
			return Permanent(fmt.Errorf("upcasting %s v%d: %w", ev.EventType, ev.EventVersion, err))
		}
		ev.Payload, ev.EventVersion = p, ev.EventVersion+1
	}
}
