// Package periodic runs a maintenance job at start and then at a fixed
// interval until its context ends. The outbox and inbox pruners share it;
// it lives beside the envelope because neither library may depend on the
// other.
package periodic

import (
	"context"
	"time"
)

// Run calls job once at once and then every interval, until ctx ends; it
// returns then. A job that fails is the job's to report: the loop goes on,
// since a maintenance failure (a database restart) is usually gone by the
// next run. Runs never overlap: a job slower than interval delays the next.
func Run(ctx context.Context, interval time.Duration, job func(context.Context)) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		job(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
