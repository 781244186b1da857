package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// GapPolicy says what to do with an event whose aggregate version is more
// than one above the last one this consumer applied: a later version over
// a missing earlier one.
type GapPolicy = engine.GapPolicy

const (
	// GapWait, the default, waits for the missing versions a bounded time:
	// the event is retried with backoff (MaxAttempts, BackoffMin,
	// BackoffMax), and then dead-lettered, visibly, with the gap as its
	// reason; its aggregate's later events park behind it (DeadKeys) until
	// an operator requeues it (it is then applied whatever the guard says)
	// or releases the aggregate. A missing earlier version that arrives
	// meanwhile is applied (it comes before the dead one). Nothing jumps
	// ahead: a refund is never forwarded over a capture that never came.
	GapWait = engine.GapWait

	// GapAccept handles the event at once and reports the gap (metric and
	// log): an explicit opt-in, right when events may be missing for good
	// (topic retention, a consumer that starts late) and handlers do not
	// depend on every step.
	GapAccept = engine.GapAccept
)

// StalePolicy says what to do with an event at or below the aggregate
// version this consumer already applied that is not a redelivery (another
// event id): an older event arriving after a newer one was applied.
type StalePolicy = engine.StalePolicy

const (
	// StaleDeadLetter, the default, dead-letters it with its reason
	// ("version N arrived after version M was applied", reason label
	// stale), without holding its aggregate back: nothing vanishes
	// silently, and an operator who requeues it has it applied whatever
	// the guard says.
	StaleDeadLetter = engine.StaleDeadLetter

	// StaleSkip skips it, marked stale in the inbox and counted
	// (inbox_stale_total): an explicit opt-in, for consumers that keep
	// only the latest state of an aggregate and lose nothing by it.
	StaleSkip = engine.StaleSkip
)

// Upcaster converts the payload of EventType from version From to From+1.
// Register one per step; the consumer applies them in a chain, so handlers
// only ever see the current version.
type Upcaster = engine.Upcaster

// Config configures a Consumer, in either mode (a lease-mode consumer's own
// knobs are in pkg/inbox/lease's Config). Zero fields take the documented defaults;
// negative ones are refused by Validate.
type Config = engine.Config
