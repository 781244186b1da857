package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The operator side of the outbox: see what is dead and requeue it, prune
// published rows, and replay what was already published. These functions
// are meant for an admin endpoint, a CLI or a background worker; none of
// them talks to Kafka. Requeue, RequeueDead and Replay are the polling
// relay's (ModePoll): rows they set back to pending are picked up on its
// next poll (RelayConfig.PollInterval). A service running a log-based relay
// calls the same actions as methods of its RelayMode (admin_modes.go),
// because those relays never read a row that was updated.
//
// Time comparisons (retention, a replay window left open at the end) use the
// database's now(): published_at and created_at were stamped by that clock,
// so comparing against it is immune to skew between application hosts.

// DB is what the operator functions need from the caller's database handle.
// *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it; given a pgx.Tx, the
// changes commit with the caller's transaction (and Prune's batches are no
// longer separate transactions).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

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

// DeadEvent is an outbox row that exhausted its publish attempts.
type DeadEvent struct {
	ID               int64
	EventID          uuid.UUID
	EventType        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Attempts is how many publishes failed.
	Attempts int
	// LastError is the last failure, the reason the row is dead.
	LastError string
	CreatedAt time.Time
}

const listDead = `
SELECT id, event_id, event_type, aggregate_type, aggregate_id, aggregate_version,
       attempts, coalesce(last_error, ''), created_at
FROM outbox_events
WHERE state = 'dead'
ORDER BY id
LIMIT $1`

// ListDead returns up to limit dead events, oldest first, so an operator can
// see what failed and why before requeuing it. A limit <= 0 means 100.
func ListDead(ctx context.Context, db DB, limit int) ([]DeadEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, listDead, limit)
	if err != nil {
		return nil, storeErr("listing dead events", err)
	}
	dead, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadEvent, error) {
		var d DeadEvent
		err := row.Scan(&d.ID, &d.EventID, &d.EventType, &d.AggregateType, &d.AggregateID,
			&d.AggregateVersion, &d.Attempts, &d.LastError, &d.CreatedAt)
		return d, err
	})
	if err != nil {
		return nil, storeErr("reading dead events", err)
	}
	return dead, nil
}

// requeueSet gives a dead row a fresh budget of attempts, due at once. The
// cause of death stays in last_error, prefixed with "requeued: ", so a
// pending row with attempts = 0 and a last_error reads as a requeued one;
// the relay overwrites it on the next failure and clears it on success.
const requeueSet = `
UPDATE outbox_events
SET state = 'pending', attempts = 0, next_attempt_at = '-infinity',
    last_error = 'requeued: ' || coalesce(last_error, '')`

// requeueIDs requeues the dead rows among the ids, unless an id names no
// row at all: then it changes nothing and returns the unknown ids, so that
// a mistyped id is reported rather than quietly skipped. Rows that exist
// but are not dead are skipped, so a requeue can be repeated safely.
const requeueIDs = `
WITH wanted AS (SELECT DISTINCT unnest($1::bigint[]) AS id),
unknown AS (
    SELECT w.id FROM wanted w WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.id = w.id)),
requeued AS (` + requeueSet + `
    WHERE id IN (SELECT id FROM wanted) AND state = 'dead' AND NOT EXISTS (SELECT 1 FROM unknown)
    RETURNING id)
SELECT (SELECT count(*) FROM requeued), coalesce((SELECT array_agg(id ORDER BY id) FROM unknown), '{}')`

// requeueDead picks the rows in a MATERIALIZED CTE, run exactly once: as a
// subquery in the WHERE clause, a LIMIT … FOR UPDATE may be re-run for each
// row the UPDATE visits, skip the rows this statement already updated, and
// so requeue more than the limit.
const requeueDead = `
WITH chosen AS MATERIALIZED (
    SELECT id FROM outbox_events
    WHERE state = 'dead'
      AND ($1 = '' OR aggregate_type = $1)
      AND ($2 = '' OR aggregate_id = $2)
    ORDER BY id
    LIMIT $3 -- NULL: no limit
    FOR UPDATE)` + requeueSet + `
WHERE id IN (SELECT id FROM chosen)`

// Requeue sets the dead rows among ids back to pending with a fresh budget
// of attempts (see requeueSet for what happens to last_error) and returns
// how many it requeued. Ids of rows that are not dead are ignored, so
// requeuing is safe to repeat. If an id names no row (mistyped, or pruned
// since), it requeues nothing and returns an error wrapping ErrNotFound
// that lists the unknown ids.
//
// While a row is dead the relay holds back the later events of its
// aggregate (see the package documentation); requeuing it releases them, to
// be published after it, in order.
//
// Requeue is ModePoll.Requeue; with a log-based relay call the method of
// its mode.
func Requeue(ctx context.Context, db DB, ids ...int64) (int, error) {
	return ModePoll.Requeue(ctx, db, ids...)
}

func requeuePoll(ctx context.Context, db DB, ids []int64) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var (
		n       int
		unknown []int64
	)
	rows, err := db.Query(ctx, requeueIDs, ids)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&n, &unknown}, func() error { return nil })
	}
	if err != nil {
		return 0, storeErr(fmt.Sprintf("requeuing %d ids", len(ids)), err)
	}
	if len(unknown) > 0 {
		return 0, fmt.Errorf("%w: no outbox row has id %s (nothing was requeued; pruned rows are gone)", ErrNotFound, listIDs(unknown))
	}
	return wake(ctx, db, n), nil
}

// listIDs spells ids for an error message, the first ten of them.
func listIDs(ids []int64) string {
	const most = 10
	s := make([]string, 0, most+1)
	for _, id := range ids[:min(len(ids), most)] {
		s = append(s, strconv.FormatInt(id, 10))
	}
	if len(ids) > most {
		s = append(s, fmt.Sprintf("and %d more", len(ids)-most))
	}
	return strings.Join(s, ", ")
}

// wake tells the relays that n rows became due, so they need not wait for
// their poll. A lost wake-up only costs that poll, so its error is ignored.
func wake(ctx context.Context, db DB, n int) int {
	if n > 0 {
		_, _ = db.Exec(ctx, wakeRelays)
	}
	return n
}

// DeadFilter selects dead rows for RequeueDead. Empty fields match anything.
type DeadFilter struct {
	AggregateType string
	AggregateID   string
	// Limit is the most rows requeued, oldest first. <= 0 means no limit.
	Limit int
}

// RequeueDead is Requeue for every dead row matching f, oldest first; it
// returns how many it requeued. The zero filter requeues every dead row,
// which is what an operator wants once the cause (a missing topic, a broker
// outage) is fixed.
//
// RequeueDead is ModePoll.RequeueDead; with a log-based relay call the
// method of its mode.
func RequeueDead(ctx context.Context, db DB, f DeadFilter) (int, error) {
	return ModePoll.RequeueDead(ctx, db, f)
}

func requeueDeadPoll(ctx context.Context, db DB, f DeadFilter) (int, error) {
	var limit any // nil: LIMIT NULL, no limit
	if f.Limit > 0 {
		limit = f.Limit
	}
	tag, err := db.Exec(ctx, requeueDead, f.AggregateType, f.AggregateID, limit)
	if err != nil {
		return 0, storeErr("requeuing dead events", err)
	}
	return wake(ctx, db, int(tag.RowsAffected())), nil
}

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
	// ID is the outbox row: after a replay in ModeCDC, the new row that
	// carries the event again (see RelayMode.Replay).
	ID               int64
	EventID          uuid.UUID
	EventType        string
	AggregateID      string
	AggregateVersion int64
	CreatedAt        time.Time
}

// replayWindow is shared by every mode's count, dry run and replay, so that
// they can never disagree about which rows are in scope; each mode's scope
// adds which states count as published.
const replayWindow = `
  AND aggregate_type = $1
  AND ($2 = '' OR aggregate_id = $2)
  AND created_at >= coalesce($3::timestamptz, '-infinity')
  AND created_at < coalesce($4::timestamptz, now())`

// replayScope is the polling relay's: it marks what it published.
const replayScope = `
WHERE state = 'published'` + replayWindow

const replayItems = `id, event_id, event_type, aggregate_id, aggregate_version, created_at`

// replayApply makes the relay publish the rows again. The event ids are
// kept: that is what lets every consumer's inbox recognise the replayed
// events as duplicates, so only consumers that never saw them act on them.
const replayApply = `
UPDATE outbox_events
SET state = 'pending', attempts = 0, next_attempt_at = '-infinity', published_at = NULL` +
	replayScope + `
RETURNING ` + replayItems

// Replay sets the published events matching f back to pending, in one
// transaction, so the relay publishes them again under their original event
// ids; it returns them in id order, the order the relay will publish them.
// With dryRun it returns the same list and changes nothing.
//
// A filter without AggregateType or From, or with To <= From, is refused
// with an error wrapping ErrInvalidFilter; a scope of more than f.Max
// (default MaxReplay) events with one wrapping ErrReplayTooLarge. Events
// already removed by Prune are out of reach: keep Retention longer than the
// window you may need to replay.
//
// Replay is ModePoll.Replay; with a log-based relay call the method of its
// mode.
func Replay(ctx context.Context, db DB, f ReplayFilter, dryRun bool) ([]ReplayItem, error) {
	return ModePoll.Replay(ctx, db, f, dryRun)
}

// replay runs a replay whose scope (a WHERE clause over replayWindow's
// parameters) and apply statement (returning replayItems) are a mode's.
func replay(ctx context.Context, db DB, f ReplayFilter, dryRun bool, scope, apply string) ([]ReplayItem, error) {
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
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox_events`+scope, args...).Scan(&n); err != nil {
		return nil, storeErr("counting replay scope", err)
	}
	if n > f.limit() {
		return nil, replayTooLarge(n, f.limit())
	}
	stmt := apply
	if dryRun {
		stmt = `SELECT ` + replayItems + ` FROM outbox_events` + scope + ` ORDER BY id`
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
