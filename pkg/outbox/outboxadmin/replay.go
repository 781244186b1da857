package outboxadmin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// ErrInvalidFilter is wrapped by the error of a Replay whose filter has no
// aggregate type, no window (From) or an empty window.
var ErrInvalidFilter = errors.New("outbox: invalid filter")

// ErrReplayTooLarge is wrapped by the error of a Replay whose scope holds
// more events than it may replay (ReplayFilter.Max, MaxReplay); the message
// tells how many and the cap.
var ErrReplayTooLarge = errors.New("outbox: replay scope too large")

// MaxReplay is the most events one Replay sets back to pending. A larger
// scope is refused rather than flooding the relay and every consumer at
// once; split it by aggregate id or by time window.
const MaxReplay = 100_000

// ReplayFilter scopes a Replay to the published events of one aggregate type
// in a time window.
type ReplayFilter struct {
	// AggregateType is required: a replay never spans every aggregate type.
	AggregateType string
	// AggregateID narrows the replay to one aggregate. Empty: all of them.
	AggregateID string
	// From and To bound created_at, half-open: From <= created_at < To.
	// From is required: a replay always takes a window, so that a filter
	// naming only an aggregate type never republishes a whole history. A
	// zero To means the database's now().
	From, To time.Time
	// Max is the most events this replay may cover; a larger scope is
	// refused whole (ErrReplayTooLarge), never cut short. 0 means MaxReplay,
	// and more than MaxReplay is refused. An endpoint sets its own per-call
	// cap here (outboxhttp.MaxReplay).
	Max int
}

func (f ReplayFilter) validate() error {
	switch {
	case f.AggregateType == "":
		return fmt.Errorf("%w: replay needs an aggregate type", ErrInvalidFilter)
	case f.From.IsZero():
		return fmt.Errorf("%w: replay needs a window: From is required (a zero To means now)", ErrInvalidFilter)
	case !f.To.IsZero() && !f.To.After(f.From):
		return fmt.Errorf("%w: replay window [%s, %s) is empty",
			ErrInvalidFilter, f.From.Format(time.RFC3339Nano), f.To.Format(time.RFC3339Nano))
	case f.Max < 0 || f.Max > MaxReplay:
		return fmt.Errorf("%w: Max %d is outside 0 to MaxReplay (%d)", ErrInvalidFilter, f.Max, MaxReplay)
	}
	return nil
}

// limit is the cap f's replay is held to.
func (f ReplayFilter) limit() int {
	if f.Max == 0 {
		return MaxReplay
	}
	return f.Max
}

// ReplayItem is one event in a Replay's scope.
type ReplayItem struct {
	// ID is the outbox row: after a replay in outbox.ModeCDC, the new row that
	// carries the event again (see Replay).
	ID               int64
	EventID          uuid.UUID
	EventType        string
	AggregateID      string
	AggregateVersion int64
	CreatedAt        time.Time
}

// Replay sets the published events matching f back to pending, in one
// transaction, so the relay of mode m publishes them again under their
// original event ids; it returns them in id order, the order the relay will
// publish them. With dryRun it returns the same list and changes nothing.
//
// A filter without AggregateType or From, or with To <= From, is refused
// with an error wrapping ErrInvalidFilter; a scope of more than f.Max
// (default MaxReplay) events with one wrapping ErrReplayTooLarge. Events
// already removed by Prune are out of reach: keep Retention longer than the
// window you may need to replay.
//
// In outbox.ModePoll the scope is the rows the relay marked published. In
// outbox.ModeCDC the scope is the rows still in the table whose position
// the relay confirmed (cdc.Config.Retain keeps them, one minute by default:
// set it to the window you may need to replay), each written again as a new
// row; the items returned name the new rows. In outbox.ModeDebezium the
// table cannot tell what Debezium has published, so the scope is every row
// of the window that is not dead (outbox.PruneConfig.PendingRetention keeps
// them), each written again as a new row: one that Debezium had not
// published yet is then published twice, which the consumers' inboxes
// absorb. That is also how to republish the window of a slot that was lost.
// In outbox.ModeWAL it is refused with ErrNotInThisMode.
func Replay(ctx context.Context, db outbox.DB, m outbox.RelayMode, f ReplayFilter, dryRun bool) ([]ReplayItem, error) {
	switch m {
	case outbox.ModePoll:
		return replay(ctx, db, f, dryRun, replayScope, replayApply)
	case outbox.ModeCDC:
		return replay(ctx, db, f, dryRun, replayScopeCDC, replayApplyCDC)
	case outbox.ModeDebezium:
		return replay(ctx, db, f, dryRun, replayScopeExternal, replayApplyExternal)
	case outbox.ModeWAL:
		if err := f.validate(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: RELAY_MODE=wal writes events only to the WAL and keeps no copy of what it published, "+
			"so there is nothing to replay from; replay from the Kafka topic itself, or write the events again from the domain data", ErrNotInThisMode)
	}
	return nil, errUnknownMode(m)
}

// replay runs a replay whose scope (a WHERE clause over replayWindow's
// parameters) and apply statement (returning replayItems) are a mode's.
func replay(ctx context.Context, db outbox.DB, f ReplayFilter, dryRun bool, scope, apply string) ([]ReplayItem, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	args := []any{f.AggregateType, f.AggregateID, nullTime(f.From), nullTime(f.To)}

	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, storeErr("beginning replay", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit

	var n int
	if err := tx.QueryRow(ctx, replayCount(scope), args...).Scan(&n); err != nil {
		return nil, storeErr("counting replay scope", err)
	}
	if n > f.limit() {
		return nil, replayTooLarge(n, f.limit())
	}
	stmt := apply
	if dryRun {
		stmt = replayList(scope)
	}
	rows, err := tx.Query(ctx, stmt, args...)
	if err != nil {
		return nil, storeErr("replaying "+f.AggregateType+" events", err)
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReplayItem, error) {
		var it ReplayItem
		err := row.Scan(&it.ID, &it.EventID, &it.EventType, &it.AggregateID, &it.AggregateVersion, &it.CreatedAt)
		return it, err
	})
	if err != nil {
		return nil, storeErr("reading replayed events", err)
	}
	if dryRun {
		return items, nil // the deferred rollback ends the read-only transaction
	}
	// The relay may have published more rows in scope since the count.
	if len(items) > f.limit() {
		return nil, replayTooLarge(len(items), f.limit())
	}
	wake(ctx, tx, len(items)) // delivered when the replay commits
	if err := tx.Commit(ctx); err != nil {
		return nil, storeErr("committing replay", err)
	}
	// UPDATE … RETURNING has no order.
	slices.SortFunc(items, func(a, b ReplayItem) int { return cmp.Compare(a.ID, b.ID) })
	return items, nil
}

func replayTooLarge(n, limit int) error {
	return fmt.Errorf("%w: %d published events match, more than one replay may cover (%d); narrow the aggregate id or the time window",
		ErrReplayTooLarge, n, limit)
}

// nullTime maps the zero time to SQL NULL, the "unbounded" of replayWindow.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}
