package inbox

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// delivery is one message in an applier's hands, with the generation it was
// fetched in, as the applier sees it.
type delivery struct {
	m   kafka.Message
	gen tracker
}

// tracker is what an applier may do with the generation a message was
// fetched in, which the dispatcher keeps (offsets.go): finish the message,
// once, and ask whether the generation was dropped meanwhile.
type tracker interface {
	// finish says the applier is done with m. ok says m's work committed
	// (or it was settled without work), so its offset may be committed; a
	// message finished not ok holds its partition's offset back and is
	// fetched again in a later generation.
	finish(m kafka.Message, ok bool)
	// isDropped reports whether the generation was dropped (a rebalance gave
	// its partitions away): the work in hand is abandoned at its next wait.
	isDropped() bool
}

// outcome is what became of one message.
type outcome int

const (
	processed outcome = iota
	duplicate
	stale
	deadLettered
	parked // held behind a dead message of its aggregate (park.go)

	numOutcomes = iota
)

// wait sleeps for d, or returns errAbandoned when ctx ends (the shutdown
// grace is over) or the message's generation is dropped first.
func wait(ctx context.Context, gen tracker, d time.Duration) error {
	if !retry.Sleep(ctx, d) || (gen != nil && gen.isDropped()) {
		return errAbandoned
	}
	return nil
}
