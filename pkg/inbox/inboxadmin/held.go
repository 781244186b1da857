package inboxadmin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/inbox/internal/state"
)

// The way out of a held aggregate, for an operator. An aggregate is held
// while a dead event of it is not requeued and applied: its later events
// are parked (settle.go). The normal way out is to fix the cause and requeue
// the dead event (RequeueDeadLetters). When that cannot work — the dead
// letter left the dead-letter topic through its retention, it cannot be
// sent whole, the event is wrong for good — ReleaseHeld lets the parked
// events be applied without it, and SkipHeld gives up on the dead and the
// parked events alike. Both need a reason, record it with what they did in
// inbox_operator_actions, and change only rows in the states they name
// (pkg/inbox/internal/state): two operators acting at once, or an operator racing the
// requeued event's redelivery, never both win.

// HeldAction names a held aggregate of one consumer, and why the operator
// acts on it.
type HeldAction struct {
	// Consumer is the inbox's name (inbox.Config.Name). Required.
	Consumer string
	// AggregateType and AggregateID name the aggregate. Required.
	AggregateType, AggregateID string
	// Reason is why, for the record (inbox_operator_actions). Required.
	Reason string
	// Operator says who acted, for the record. Optional.
	Operator string
}

// HeldResult is what ReleaseHeld or SkipHeld did.
type HeldResult struct {
	// Dead are the dead events whose holds were removed.
	Dead []uuid.UUID
	// Parked is how many parked events were let go (ReleaseHeld: to be
	// applied, in order) or skipped (SkipHeld).
	Parked int
}

// ErrNotHeld is returned when the aggregate has no hold (ReleaseHeld), or
// neither a hold nor parked events (SkipHeld): another operator acted, or
// the requeued event was applied meanwhile. Nothing was changed.
var ErrNotHeld = errors.New("inbox: the aggregate is not held")

// ErrInvalidHeldAction is wrapped by the error of an action that misses a
// field.
var ErrInvalidHeldAction = errors.New("inbox: invalid held-aggregate action")

// Validate refuses an action without a consumer, an aggregate or a reason.
func (a HeldAction) Validate() error {
	var missing []string
	for name, v := range map[string]string{"consumer": a.Consumer, "aggregate type": a.AggregateType,
		"aggregate id": a.AggregateID, "reason": a.Reason} {
		if strings.TrimSpace(v) == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: name the %s", ErrInvalidHeldAction, strings.Join(missing, ", "))
	}
	return nil
}

// The actions recorded in inbox_operator_actions.
const (
	ActionRelease = state.ActionRelease
	ActionSkip    = state.ActionSkip
)

// ReleaseHeld lets the parked events of a held aggregate go: its holds are
// removed, and the consumer applies the parked events in the order they
// arrived (within its inbox.Config.LagInterval, or at the aggregate's next event). The
// dead events stay dead and visible: a dead_lettered row stays so, a
// requeued one whose copy never came goes back to dead_lettered, and a
// later requeue of one applies it after its successors. Use it when the
// dead event is lost or no longer matters to what follows it.
func ReleaseHeld(ctx context.Context, db RequeueDB, a HeldAction) (HeldResult, error) {
	return actOnHeld(ctx, db, a, ActionRelease)
}

// SkipHeld gives up on a held aggregate's dead and parked events alike:
// each is recorded 'skipped' with the reason, never applied (their
// redeliveries are duplicates), the parking is emptied and the holds
// removed, so the aggregate's next events are applied as they come.
func SkipHeld(ctx context.Context, db RequeueDB, a HeldAction) (HeldResult, error) {
	return actOnHeld(ctx, db, a, ActionSkip)
}

// lockHeldRows locks, in message_id order, the inbox rows of the dead
// messages that hold an aggregate, before actOnHeld removes the holds.
const lockHeldRows = `
SELECT i.message_id FROM inbox_messages i
WHERE i.consumer = $1 AND i.message_id IN (
    SELECT d.message_id FROM inbox_dead_keys d WHERE d.consumer = $1 AND d.aggregate_type = $2 AND d.aggregate_id = $3)
ORDER BY i.message_id
FOR UPDATE OF i`

// heldMismatch is actOnHeld's error, its transaction rolled back, when the
// released holds name rows that are not in the state their hold says (a
// row that moved on, or is gone): the operator sees it and nothing is
// half done.
func heldMismatch(action string, changed, held int) error {
	return fmt.Errorf("%w: %s changed %d of the %d inbox rows its holds name (the rows moved on); nothing was changed, try again",
		ErrNotHeld, action, changed, held)
}

func actOnHeld(ctx context.Context, db RequeueDB, a HeldAction, action string) (HeldResult, error) {
	if err := a.Validate(); err != nil {
		return HeldResult{}, err
	}
	if _, ok := db.(pgx.Tx); ok {
		return HeldResult{}, errors.New("inbox: ReleaseHeld and SkipHeld need a pool or a connection, not a transaction")
	}
	var res HeldResult
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		res = HeldResult{Dead: []uuid.UUID{}}
		// The inbox rows first, then the holds: the order of a worker
		// reapplying a requeued message (state.Record or state.Reclaim on its row,
		// then state.DropHold), so that the two never wait for each other (a
		// deadlock, 40P01, the other way round).
		if _, err := tx.Exec(ctx, lockHeldRows, a.Consumer, a.AggregateType, a.AggregateID); err != nil {
			return err
		}
		rows, err := state.TakeQuery(ctx, tx, &state.ReleaseHolds, a.Consumer, a.AggregateType, a.AggregateID)
		if err != nil {
			return err
		}
		var requeued []uuid.UUID
		var (
			id      uuid.UUID
			status  string
			version int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&id, &status, &version}, func() error {
			res.Dead = append(res.Dead, id)
			if status == "requeued" {
				requeued = append(requeued, id)
			}
			return nil
		}); err != nil {
			return err
		}
		reason := fmt.Sprintf("%s by operator %q: %s", action, a.Operator, a.Reason)
		if action == ActionSkip {
			n, err := state.TakeCount(ctx, tx, &state.Skip, a.Consumer, res.Dead, reason)
			if err != nil {
				return err
			}
			if n != len(res.Dead) {
				return heldMismatch(action, n, len(res.Dead))
			}
			if res.Parked, err = skipParked(ctx, tx, a, reason); err != nil {
				return err
			}
		} else {
			n, err := state.TakeCount(ctx, tx, &state.Unrequeue, a.Consumer, requeued)
			if err != nil {
				return err
			}
			if n != len(requeued) {
				return heldMismatch(action, n, len(requeued))
			}
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM inbox_parked_messages WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
				a.Consumer, a.AggregateType, a.AggregateID).Scan(&res.Parked); err != nil {
				return err
			}
		}
		// Parked events with no hold ahead of them are on their way
		// already (the consumer releases them): only a skip acts on them.
		if len(res.Dead) == 0 && (action == ActionRelease || res.Parked == 0) {
			return ErrNotHeld
		}
		_, err = state.Take(ctx, tx, &state.RecordAction, a.Consumer, a.AggregateType, a.AggregateID, action, a.Reason, a.Operator,
			res.Dead, res.Parked)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			return HeldResult{}, err
		}
		return HeldResult{}, dbErrors.Translate("inbox: "+action+" of a held aggregate", err)
	}
	return res, nil
}

// skipParked empties the aggregate's parking, recording each parked event
// skipped.
func skipParked(ctx context.Context, tx pgx.Tx, a HeldAction, reason string) (int, error) {
	rows, err := state.TakeQuery(ctx, tx, &state.SkipParked, a.Consumer, a.AggregateType, a.AggregateID)
	if err != nil {
		return 0, err
	}
	var (
		ids               []uuid.UUID
		types, topics     []string
		versions, offsets []int64
		partitions        []int32
		id                uuid.UUID
		typ, topic        string
		version, offset   int64
		partition         int32
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &typ, &version, &topic, &partition, &offset}, func() error {
		ids, types, versions = append(ids, id), append(types, typ), append(versions, version)
		topics, partitions, offsets = append(topics, topic), append(partitions, partition), append(offsets, offset)
		return nil
	}); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	_, err = state.Take(ctx, tx, &state.SkipParkedRow, a.Consumer, a.AggregateType, a.AggregateID, reason,
		ids, types, versions, topics, partitions, offsets)
	return len(ids), err
}
