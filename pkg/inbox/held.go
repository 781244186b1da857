package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// HeldAction names a held aggregate of one consumer, and why the operator
// acts on it.
type HeldAction = engine.HeldAction

// HeldResult is what ReleaseHeld or SkipHeld did.
type HeldResult = engine.HeldResult

// ErrNotHeld is returned when the aggregate has no hold (ReleaseHeld), or
// neither a hold nor parked events (SkipHeld): another operator acted, or
// the requeued event was applied meanwhile. Nothing was changed.
var ErrNotHeld = engine.ErrNotHeld

// ErrInvalidHeldAction is wrapped by the error of an action that misses a
// field.
var ErrInvalidHeldAction = engine.ErrInvalidHeldAction

// The actions recorded in inbox_operator_actions.
const (
	ActionRelease = engine.ActionRelease
	ActionSkip    = engine.ActionSkip
)

// ReleaseHeld lets the parked events of a held aggregate go: its holds are
// removed, and the consumer applies the parked events in the order they
// arrived (within its LagInterval, or at the aggregate's next event). The
// dead events stay dead and visible: a dead_lettered row stays so, a
// requeued one whose copy never came goes back to dead_lettered, and a
// later requeue of one applies it after its successors. Use it when the
// dead event is lost or no longer matters to what follows it.
func ReleaseHeld(ctx context.Context, db RequeueDB, a HeldAction) (HeldResult, error) {
	return engine.ReleaseHeld(ctx, db, a)
}

// SkipHeld gives up on a held aggregate's dead and parked events alike:
// each is recorded 'skipped' with the reason, never applied (their
// redeliveries are duplicates), the parking is emptied and the holds
// removed, so the aggregate's next events are applied as they come.
func SkipHeld(ctx context.Context, db RequeueDB, a HeldAction) (HeldResult, error) {
	return engine.SkipHeld(ctx, db, a)
}
