package outboxadmin

import (
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/pgerr"
)

// The errors this package's functions wrap, besides outbox.ErrUnavailable.
var (
	// ErrNotFound is wrapped by the error of an operator function asked
	// about outbox rows that do not exist (Requeue of unknown ids).
	ErrNotFound = errors.New("outbox: no such event")
	// ErrNotInThisMode is wrapped by the error of an operator action the
	// relay mode cannot carry out (a replay in RELAY_MODE=wal, which keeps no
	// copy of what it published): refused, with the reason and what to do
	// instead, rather than answered with a success that will not happen.
	ErrNotInThisMode = errors.New("outbox: not possible in this relay mode")
)

// storeErrors are the names storeErr gives the driver's errors: this file
// is the operator functions' store boundary, as package outbox's errors.go
// is the library's.
var storeErrors = pgerr.StoreErrors{NotFound: ErrNotFound, Unavailable: outbox.ErrUnavailable}

// storeErr wraps err, an error from Postgres while doing what, translating
// what the driver says into the named errors; the driver's error stays in
// the chain for logs.
func storeErr(what string, err error) error { return storeErrors.Translate("outbox: "+what, err) }

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
//     window that is not dead (see Replay).

func errUnknownMode(m outbox.RelayMode) error {
	return fmt.Errorf("outbox: unknown relay mode %q (poll, cdc, wal or debezium)", m)
}
