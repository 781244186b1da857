// Package inboxadmin is the operator's side of the inbox: what a person (or
// an operator endpoint, or a reconciliation report) does about messages the
// consumers could not apply. A service that only consumes and prunes needs
// package inbox alone; this package is for the tool or endpoint that looks
// at the dead letters and acts on them.
//
// Dead letters, in the dead-letter topic (<topic>.dlt by default):
//   - ListDeadLetters reads them, changing nothing.
//   - RequeueDeadLetters sends them back to their original topic, pending
//     ones only unless named by event id, in calls of at most
//     MaxRequeueLimit that go on from a cursor.
//
// Aggregates held behind a dead message (unless inbox.Config.SkipAheadOfDead):
//   - ListParked lists the messages waiting behind it.
//   - ReleaseHeld lets them go, leaving the dead message dead; SkipHeld
//     gives up on the dead and the parked alike, recorded skipped. Either
//     is recorded in inbox_operator_actions (ActionRelease, ActionSkip).
//
// Reading the inbox tables, with a read-only role's handle if need be:
//   - Backlog counts what needs attention (expired leases, uncertain rows,
//     dead letters, parked messages), with the oldest few of each.
//   - MessagesOf returns the inbox rows of one aggregate: an event's status.
//
// Pruning once, now (a service prunes in the background with
// inbox.NewPruner):
//   - Prune removes the rows of handled events past their retention.
//
// Every write here is a transition of the inbox's state machine
// (pkg/inbox/internal/state, drawn in docs/inbox.md), the same the
// consumers make, so an operator racing a consumer or another operator
// changes nothing that is no longer what it expected: it gets ErrNotHeld,
// or its requeue finds nothing pending, instead of undoing the other's
// work. Kafka is reached with plain TCP unless WithDialer says otherwise.
package inboxadmin
