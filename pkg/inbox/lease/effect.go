package lease

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
)

// ErrUnknowable is what Effect.Check returns when the other side answered
// but cannot say whether it already has an idempotency key (its answer does
// not decide it). The message is marked 'uncertain' for reconciliation.
var ErrUnknowable = errors.New("cannot tell whether the side effect happened")

// ErrUnavailable is what Effect.Check and Effect.Call wrap when the other
// side cannot be reached or cannot serve now (connection refused, a
// timeout, a 5xx): an outage, not the message's fault. It is waited out
// with capped backoff (BackoffMin to BackoffMax), counted
// (inbox_effect_errors_total), shown (inbox_effect_connected,
// inbox.Consumer.Healthy), never charged as an attempt and never a dead letter by
// itself. A Call that failed so may still have landed: the next try checks
// first. A call cut off by Config.CallTimeout counts as one.
var ErrUnavailable = errors.New("the other side of the side effect is unavailable")

// Outcome is how a leased message's side effect was settled.
type Outcome string

// The outcomes Effect.Done and DoneBatch are told about.
const (
	// Sent: this delivery performed the side effect.
	Sent Outcome = "sent"
	// AlreadyPresent: an earlier delivery performed it (and then crashed or
	// timed out before marking done); the other side confirmed the key.
	AlreadyPresent Outcome = "already_present"
)

// Effect is a side effect outside the database, such as a call to a third
// party that cannot be made idempotent. The consumer runs it in lease mode:
//
//  1. claim the message: its inbox row becomes 'leased' to this worker until
//     LeaseTTL from now, with a fencing token that grows with every lease;
//  2. call out with the event id as the idempotency key;
//  3. mark the row done, only if the fencing token is still this worker's,
//     and run Done in that same transaction.
//
// A worker does 1 and 3 for a batch of messages at a time, in one
// transaction each, and 2 for distinct keys concurrently; Check and Call
// must be safe for concurrent use.
//
// If a worker dies between 2 and 3, the lease expires and the next delivery
// takes it over. It must not call blindly: it first asks Check. Found: the
// row is marked done as AlreadyPresent without calling. Not found: it calls.
// Unknowable: the row is marked 'uncertain' for the reconciliation report and
// nothing is called. The same check precedes every retry after a failed Call,
// since a timed-out call may have landed.
//
// A worker acts only under a lease it holds. Each Check and each Call takes
// one of the MaxInFlight call slots, then renews the lease under its
// fencing token (unless the batch took the lease less than a tenth of
// CallTimeout ago: that was the renewal), and only then starts, with a ctx
// that ends CallTimeout after that renewal: at least LeaseTTL - CallTimeout
// before the lease can expire, which leaves LeaseMargin for a call to land
// after its ctx ended.
// A renewal that finds the token changed (another worker took the message
// over) ends the message's work in this worker at once, and the later
// messages of its key in this worker's hands are abandoned with it (they are
// redelivered, after it). So a takeover, which needs the lease expired,
// comes after the previous holder's last possible call has ended and landed
// (see the package doc for the window that remains).
type Effect struct {
	// Check asks the other side whether it already has key. Return an
	// error wrapping ErrUnavailable when the other side cannot be reached
	// or cannot serve (waited out), and ErrUnknowable when it answered but
	// its answer does not decide (the message is marked uncertain).
	// It must return once ctx ends. Required.
	Check func(ctx context.Context, key string) (bool, error)
	// Call performs the side effect, passing key along. An error wrapping
	// inbox.ErrPermanent dead-letters the message; one wrapping ErrUnavailable is
	// an outage, waited out; others are retried up to MaxAttempts. It must
	// send nothing once ctx has ended. Required.
	Call func(ctx context.Context, ev event.Envelope, key string) error
	// Done records the outcome in the consumer's database, in the
	// transaction that marks the message done: one transaction for the
	// messages of a batch, so an error rolls back the batch's marking, and
	// each message is then marked done in a transaction of its own. Optional.
	Done func(ctx context.Context, tx pgx.Tx, ev event.Envelope, outcome Outcome) error
	// DoneBatch is Done for all the messages a transaction marks done at
	// once (a batch's; one for a message settled alone), so that a consumer
	// recording outcomes in a table writes them in one statement instead of
	// one per message. Set Done or DoneBatch, not both. Optional.
	DoneBatch func(ctx context.Context, tx pgx.Tx, done []DoneEvent) error
}

// DoneEvent is one message DoneBatch records: its event and how its side
// effect was settled.
type DoneEvent struct {
	Event   event.Envelope
	Outcome Outcome
}
