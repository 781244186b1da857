// Package outboxadmin is the operator side of the outbox: see what is
// dead and requeue it (ListDead, Requeue, RequeueDead), replay what was
// already published (Replay), count what is old and stuck (Backlog), and
// read the events of one aggregate (EventsOf), and prune once, now
// (Prune). These functions are meant for an admin endpoint, a CLI, a
// reconciliation job or a background worker; none of them talks to Kafka.
// A service that only enqueues, relays and prunes in the background
// (outbox.NewPruner) never needs this package;
// platform/outboxhttp serves these functions over HTTP.
//
// Requeue, RequeueDead and Replay take the outbox.RelayMode the service
// runs, one entry point that works in every mode: in outbox.ModePoll the
// rows they set back to pending are picked up by the relay's next claim;
// the log-based relays never read a row that was updated, so there the
// event is written again (errors.go says how in each mode). An action a
// mode cannot carry out is refused with ErrNotInThisMode (invariant 8).
//
// Errors wrap named errors callers can test with errors.Is: ErrNotFound (a
// requeue of ids that name no row), outbox.ErrUnavailable (Postgres
// unreachable), ErrInvalidFilter and ErrReplayTooLarge (a replay refused),
// ErrNotInThisMode. Backlog and EventsOf only SELECT: a read-only role may
// run them.
//
// Time comparisons (a replay window left open at the end, a backlog's age)
// use the database's now(): published_at and created_at were stamped by
// that clock, so comparing against it is immune to skew between
// application hosts.
package outboxadmin
