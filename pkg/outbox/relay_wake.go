package outbox

import (
	"context"
	"math"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
)

// busyRate is the rate of claimed rows (per second) above which an armed
// relay disarms. Armed, every writer's commit notifies, and notifying
// commits queue on a cluster-wide lock (migration 0004); the relay claims
// about once per commit. Disarmed, writers do not notify and the relay
// claims back to back, once per cycle (a few ms: claim, publish, mark).
// Around a few hundred events a second the claims cost the same either
// way, and above it notifying only costs the writers.
const busyRate = 200

// rateWindow is the time constant of the relay's estimate of its rate.
const rateWindow = 100 * time.Millisecond

// noteRate adds n claimed rows to the relay's estimate of its rate, an
// exponentially decaying count over rateWindow, and returns the estimate
// in rows per second. Used only by the claim loop.
func (r *Relay) noteRate(n int, now time.Time) float64 {
	decay := math.Exp(-float64(now.Sub(r.rateAt)) / float64(rateWindow))
	r.rate, r.rateAt = r.rate*decay+float64(n), now
	return r.rate / rateWindow.Seconds()
}

// lingers reports whether the relay should wait Linger before its next
// claim: whether, at its recent rate, at least a quarter of a commit is
// expected meanwhile.
func (r *Relay) lingers() bool {
	return r.noteRate(0, time.Now())*r.cfg.Linger.Seconds() >= 0.25
}

// wakeOps are the changes to the relay's wake-up that ride along with a
// batch's round trips.
type wakeOps struct {
	// arm arms before the claim.
	arm bool
	// disarmIfBusy disarms when the batch commits if the claim filled the
	// batch (a backlog) or the relay's rate is above busyRate.
	disarmIfBusy bool
}

// listen forwards commit notifications to wake, reconnecting with backoff on
// failure; the poll covers the time without.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for streak := 1; ctx.Err() == nil; streak++ {
		err := r.listenOnce(ctx, wake, func() { streak = 0; r.listening.OK(ctx) })
		if ctx.Err() != nil {
			return
		}
		r.cfg.Metrics.DbErrors.WithLabelValues("listen").Inc()
		r.listening.Fail(ctx, err)
		if !retry.Sleep(ctx, retry.Backoff(max(streak, 1), r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)) {
			return
		}
	}
}

// listenOnce listens on one connection until it fails; listening is called
// once LISTEN took effect.
func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}, listening func()) error {
	pooled, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Take the connection out of the pool: its LISTEN must not leak to other users.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	r.cfg.Metrics.RoundTrips.WithLabelValues("listen").Inc()
	if _, err := conn.Exec(ctx, "LISTEN "+lifecycle.NotifyChannel); err != nil {
		return err
	}
	listening()
	// Rows committed while nobody listened notified no one.
	select {
	case wake <- struct{}{}:
	default:
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}
