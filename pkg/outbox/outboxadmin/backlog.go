package outboxadmin

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/backlog"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
)

// Backlog is the outbox's read of "rows not yet published, or dead, older
// than T", for
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

// The backlog's statements, per state: $1 is the age in microseconds
// (now() is the database's clock, which stamped created_at, so application
// hosts' skew does not matter), $2 the number of samples. Pending means not
// yet published, in every relay mode: a row the polling relay published is
// marked so, and one the log-based relay published (publishedCDC: its
// commit confirmed by the slot) stays 'pending' until retention deletes it,
// so it is left out here; counting it made a longer cdc.Config.Retain read
// as a stuck relay. Under Debezium the table cannot tell what was
// published: every row stays pending (see docs/outbox.md).
var (
	backlogPending = `state = 'pending' AND NOT ` + lifecycle.PublishedCDC("outbox_events")
	backlogDead    = `state = 'dead'`
)

func backlogCount(where string) string {
	return `
		SELECT count(*), min(created_at) FROM outbox_events
		 WHERE ` + where + ` AND created_at <= now() - $1::bigint * interval '1 microsecond'`
}

func backlogSamples(where string) string {
	return `
		SELECT event_id FROM outbox_events
		 WHERE ` + where + ` AND created_at <= now() - $1::bigint * interval '1 microsecond'
		 ORDER BY created_at, id LIMIT $2`
}

// Backlog counts the outbox's pending (not yet published) and dead rows
// older than cfg says, with the oldest one's age and the ids of the oldest
// few. Its errors wrap ErrUnavailable when Postgres cannot be reached; a
// missing table (an unmigrated database) stays a *pgconn.PgError in the
// chain (SQLSTATE 42P01), never an empty report.
func Backlog(ctx context.Context, db BacklogDB, cfg BacklogConfig) (BacklogReport, error) {
	if err := cfg.Validate(); err != nil {
		return BacklogReport{}, err
	}
	var (
		rep BacklogReport
		err error
	)
	if rep.Pending, err = backlogState(ctx, db, lifecycle.StatePending, backlogPending, cfg.PendingOlderThan, cfg.Samples); err != nil {
		return BacklogReport{}, err
	}
	if rep.Dead, err = backlogState(ctx, db, lifecycle.StateDead, backlogDead, cfg.DeadOlderThan, cfg.Samples); err != nil {
		return BacklogReport{}, err
	}
	return rep, nil
}

func backlogState(ctx context.Context, db BacklogDB, state, where string, olderThan time.Duration, samples int) (BacklogState, error) {
	return backlog.Read(ctx, db, backlogCount(where), backlogSamples(where), []any{olderThan.Microseconds()}, samples,
		func(doing string, err error) error { return storeErr(doing+" "+state+" rows", err) })
}
