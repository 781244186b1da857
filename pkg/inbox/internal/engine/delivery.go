package engine

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Delivery is one message in an applier's hands, with the generation it was
// fetched in, as the applier sees it.
type Delivery struct {
	Msg kafka.Message
	Gen Tracker
}

// Tracker is what an applier may do with the generation a message was
// fetched in, which the dispatcher keeps (offsets.go): finish the message,
// once, and ask whether the generation was dropped meanwhile.
type Tracker interface {
	// Finish says the applier is done with m. ok says m's work committed
	// (or it was settled without work), so its offset may be committed; a
	// message finished not ok holds its partition's offset back and is
	// fetched again in a later generation.
	Finish(m kafka.Message, ok bool)
	// IsDropped reports whether the generation was dropped (a rebalance gave
	// its partitions away): the work in hand is abandoned at its next wait.
	IsDropped() bool
}

// Outcome is what became of one message.
type Outcome int

const (
	Processed Outcome = iota
	Duplicate
	Stale
	DeadLettered
	ParkedOutcome // held behind a dead message of its aggregate (park.go)

	NumOutcomes = iota
)

// Wait sleeps for d, or returns errAbandoned when ctx ends (the shutdown
// grace is over) or the message's generation is dropped first.
func Wait(ctx context.Context, gen Tracker, d time.Duration) error {
	if !retry.Sleep(ctx, d) || (gen != nil && gen.IsDropped()) {
		return ErrAbandoned
	}
	return nil
}
