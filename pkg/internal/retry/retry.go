// Package retry holds the backoff policy and the outage tracker the outbox
// relay and the inbox consumer share, so both retry and log outages the
// same way.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the delay before attempt (counting from 1): exponential from min,
// capped at max, with jitter over its upper half so that many failures
// happening together do not retry together.
func Backoff(attempt int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d or until ctx ends, and reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
