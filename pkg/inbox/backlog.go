package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// BacklogDB is what Backlog reads through: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx (Query and QueryRow). Reads only: a read-only role's handle is
// enough.
type BacklogDB = engine.BacklogDB

// BacklogConfig says which rows Backlog counts. The zero value counts every
// consumer's expired leases, uncertain and dead-lettered rows, of any age,
// and lists no samples.
type BacklogConfig = engine.BacklogConfig

// BacklogState is what Backlog found in one status: Count rows old enough,
// Oldest when the oldest of them began (its lease_until for an expired
// lease, its received_at otherwise; zero when Count is 0), and Samples, the
// message (event) ids of the oldest of them, oldest first, at most
// BacklogConfig.Samples.
type BacklogState = engine.BacklogState

// BacklogReport is Backlog's result, one BacklogState per status that needs
// attention.
type BacklogReport = engine.BacklogReport

// Backlog counts the inbox's expired leases, uncertain rows, dead letters
// and parked messages older than cfg says, with the oldest one's time and the ids of
// the oldest few. Its errors are named like the consumer's (a database that
// cannot be reached satisfies pgerr.IsUnavailable); a missing table (an
// unmigrated database) stays a *pgconn.PgError in the chain (SQLSTATE
// 42P01), never an empty report.
func Backlog(ctx context.Context, db BacklogDB, cfg BacklogConfig) (BacklogReport, error) {
	return engine.Backlog(ctx, db, cfg)
}
