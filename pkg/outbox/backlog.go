package outbox

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/backlog"
)

// Backlog is the outbox's read of "rows in state S older than T", for
// operators' checks (tools/reconcile) and dashboards, so that nothing outside
// this package has to know the table's name or its states. It only SELECTs:
// a read-only role (pgroles' readers, e.g. reconcile_ro) may run it.

// BacklogDB is what Backlog reads through: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx (Query and QueryRow). Reads only: a read-only role's handle is
// enough.
type BacklogDB = backlog.DB

// BacklogConfig says which rows Backlog counts. The zero value counts every
// pending and every dead row and lists no samples.
type BacklogConfig struct {
	// PendingOlderThan counts a pending row once its created_at is at least
	// this far behind the database's now(): a relay keeping up leaves none
	// older than a few poll intervals.
	PendingOlderThan time.Duration
	// DeadOlderThan counts a dead row once its created_at is at least this
	// old. 0 counts every dead row: each one needs an operator.
	DeadOlderThan time.Duration
	// Samples is how many event ids of the oldest counted rows each state
	// lists, oldest first. 0 lists none.
	Samples int
}

// Validate refuses negative fields: a negative age would count rows from
// the future (none) and read as a clean outbox.
func (c BacklogConfig) Validate() error {
	return backlog.Validate("outbox", c.Samples,
		backlog.Age{Field: "PendingOlderThan", Value: c.PendingOlderThan},
		backlog.Age{Field: "DeadOlderThan", Value: c.DeadOlderThan})
}

// BacklogState is what Backlog found in one state: Count rows old enough,
// Oldest the created_at of the oldest of them (zero when Count is 0), and
// Samples, the event ids of the oldest of them, oldest first, at most
// BacklogConfig.Samples.
type BacklogState = backlog.State

// BacklogReport is Backlog's result: the old pending rows (the relay is
// behind or stopped) and the dead ones (the broker refused them for good).
type BacklogReport struct {
	Pending BacklogState
	Dead    BacklogState
}

// The backlog's statements. $1 is the state, $2 the age in microseconds
// (now() is the database's clock, which stamped created_at, so application
// hosts' skew does not matter), $3 the number of samples.
const (
	sqlBacklogCount = `
		SELECT count(*), min(created_at) FROM outbox_events
		 WHERE state = $1 AND created_at <= now() - $2::bigint * interval '1 microsecond'`
	sqlBacklogSamples = `
		SELECT event_id FROM outbox_events
		 WHERE state = $1 AND created_at <= now() - $2::bigint * interval '1 microsecond'
		 ORDER BY created_at, id LIMIT $3`
)

// Backlog counts the outbox's pending and dead rows older than cfg says,
// with the oldest one's age and the ids of the oldest few. Its errors wrap
// ErrUnavailable when Postgres cannot be reached; a missing table (an
// unmigrated database) stays a *pgconn.PgError in the chain (SQLSTATE
// 42P01), never an empty report.
func Backlog(ctx context.Context, db BacklogDB, cfg BacklogConfig) (BacklogReport, error) {
	if err := cfg.Validate(); err != nil {
		return BacklogReport{}, err
	}
	var (
		rep BacklogReport
		err error
	)
	if rep.Pending, err = backlogState(ctx, db, statePending, cfg.PendingOlderThan, cfg.Samples); err != nil {
		return BacklogReport{}, err
	}
	if rep.Dead, err = backlogState(ctx, db, stateDead, cfg.DeadOlderThan, cfg.Samples); err != nil {
		return BacklogReport{}, err
	}
	return rep, nil
}

func backlogState(ctx context.Context, db BacklogDB, state string, olderThan time.Duration, samples int) (BacklogState, error) {
	return backlog.Read(ctx, db, sqlBacklogCount, sqlBacklogSamples, []any{state, olderThan.Microseconds()}, samples,
		func(doing string, err error) error { return storeErr(doing+" "+state+" rows", err) })
}
