package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The operator side of the outbox: see what is dead and requeue it, prune
// published rows, and replay what was already published. These functions
// are meant for an admin endpoint, a CLI or a background worker; none of
// them talks to Kafka. Requeue, RequeueDead and Replay are methods of the
// RelayMode the service runs (dead.go, replay.go), one entry point that
// works in every mode: in ModePoll the rows they set back to pending are
// picked up by the relay's next claim; the log-based relays never read a
// row that was updated, so there the event is written again (below).
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

// The operator actions of every relay mode (invariant 8: they work, or they
// refuse with ErrNotInThisMode; none reports a success that will not
// happen).
//
// The polling relay reads the table, so setting a row back to pending is
// enough. A log-based relay reads only inserts from the replication stream
// (publication outbox_events_pub is insert-only, so that retention's
// deletes are not streamed): a row set back to pending is never streamed
// again, and its retention deletes it. So in those modes an action writes
// the event again under its own event id — consumers dedupe on it:
//
//   - ModeCDC: the row is deleted and inserted again, in one statement, as a
//     new pending row (a new id, everything else kept), which the stream
//     carries like any insert. Deleting first is what lets the copy keep
//     the event id that outbox_events holds unique.
//   - ModeWAL: a dead row (one the table still holds, from a time this
//     outbox ran in another mode) is emitted into the WAL (Emit) and
//     deleted, in one transaction. The WAL-only relay itself keeps no copy
//     of what it publishes or skips: a replay has nothing to replay from,
//     and a requeue that finds no dead row says so, with ErrNotInThisMode.
//   - ModeDebezium: as ModeCDC, since Debezium too streams the inserts of
//     outbox_events_pub. But Debezium marks no row dead (a record Kafka
//     refuses fails the connector's task, which Connect reports), so a
//     requeue that finds no dead row says so, with ErrNotInThisMode; and it
//     marks no row published, so a replay's scope is every row of the
//     window that is not dead (see RelayMode.Replay).

func errUnknownMode(m RelayMode) error {
	return fmt.Errorf("outbox: unknown relay mode %q (poll, cdc, wal or debezium)", m)
}
