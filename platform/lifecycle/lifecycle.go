// Package lifecycle runs a service's long-lived parts together and stops them
// in a fixed order, so that shutdown drains rather than drops: first the HTTP
// server stops taking requests, then consumers finish the message in hand,
// then the relay publishes what was committed, and only then does the caller
// close the pool.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
)

// Stage is one long-lived part of a service. Run must return soon after its
// context ends, having finished its in-flight work; it returns nil then.
type Stage struct {
	Name string
	Run  func(ctx context.Context) error
}

// Run starts every stage at once and blocks until ctx ends or a stage fails.
// It then stops the stages in the order given: each stage's context ends
// only after the stage before it has returned. It returns the stages'
// errors, joined.
func Run(ctx context.Context, stages ...Stage) error {
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	stops := make([]context.CancelFunc, len(stages))
	done := make([]chan error, len(stages))
	for i, s := range stages {
		stageCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		stops[i], done[i] = stop, make(chan error, 1)
		go func() {
			err := s.Run(stageCtx)
			if err != nil {
				err = fmt.Errorf("%s: %w", s.Name, err)
				stopAll() // one failed part stops the service
			} else if stageCtx.Err() == nil {
				err = fmt.Errorf("%s stopped unexpectedly", s.Name)
				stopAll()
			}
			done[i] <- err
		}()
	}
	<-ctx.Done()
	var errs []error
	for i := range stages {
		stops[i]()
		if err := <-done[i]; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
