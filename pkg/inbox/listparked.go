package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Parked is one message held behind a dead message of its aggregate, as
// ListParked shows it to an operator.
type Parked = engine.Parked

// MaxParkedLimit is the most parked messages one ListParked call lists.
const MaxParkedLimit = engine.MaxParkedLimit

// ParkedFilter selects what ListParked lists. The zero value lists the
// oldest DefaultListLimit parked messages of every consumer.
type ParkedFilter = engine.ParkedFilter

// ListParked lists parked messages, each aggregate's in the order they will
// be released. Reads only: a read-only role may run it. They leave the
// parking when the dead message of their aggregate is requeued (see
// RequeueDeadLetters) and applied.
func ListParked(ctx context.Context, db BacklogDB, f ParkedFilter) ([]Parked, error) {
	return engine.ListParked(ctx, db, f)
}
