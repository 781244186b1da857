package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
)

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
// under GapWait, and a stale event under StaleDeadLetter, is an error: the
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
		case ev.AggregateVersion <= prev && s.Config.Stale == StaleDeadLetter:
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
			if s.Config.Gaps == GapWait {
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
	case ev.AggregateVersion <= *prev && s.Config.Stale == StaleDeadLetter:
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
		if s.Config.Gaps == GapWait {
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
// version its aggregate already applied (StaleDeadLetter). It is permanent
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
