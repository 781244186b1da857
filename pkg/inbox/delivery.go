package inbox

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
)

// delivery is a fetched message and the generation it was fetched in.
type delivery struct {
	m   kafka.Message
	gen *generation
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
func wait(ctx context.Context, gen *generation, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return errAbandoned
	case <-t.C:
	}
	if gen != nil && gen.isDropped() {
		return errAbandoned
	}
	return nil
}
