package inbox

import (
	"context"
	"fmt"
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

// committed is called once msgs' database work committed: it passes the
// crash point, then lets their offsets be committed.
func (c *Consumer) committed(_ context.Context, msgs []delivery) error {
	if len(msgs) == 0 {
		return nil
	}
	if c.cfg.CrashPoint != nil {
		if err := c.cfg.CrashPoint(CrashAfterCommit); err != nil {
			for _, d := range msgs {
				d.gen.finish(d.m, false)
			}
			return &crashError{fmt.Errorf("crash point %s: %w", CrashAfterCommit, err)}
		}
	}
	for _, d := range msgs {
		d.gen.finish(d.m, true)
	}
	return nil
}

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
