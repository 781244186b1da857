package outbox

import (
	"context"
	"fmt"
	"math"
	"time"
)

func (r *CDCRelay) every(ctx context.Context, interval time.Duration, o *outage, op string, f func(context.Context) error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		err := f(callCtx)
		cancel()
		switch {
		case err == nil:
			o.ok(ctx)
		case ctx.Err() == nil:
			r.cfg.Metrics.dbErrors.WithLabelValues(op).Inc()
			o.fail(ctx, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *CDCRelay) refreshGauges(ctx context.Context) error {
	var lag, retained, keepMB, dead int64
	if err := r.pool.QueryRow(ctx, cdcGauges, r.cfg.Slot).Scan(&lag, &retained, &keepMB, &dead); err != nil {
		return fmt.Errorf("reading the slot's gauges: %w", err)
	}
	// Unlimited is +Inf, so retained / keep size, what the alert
	// OutboxSlotNearInvalidation divides, is 0 and not +Inf.
	keep := math.Inf(1)
	if keepMB >= 0 {
		keep = float64(keepMB << 20)
	}
	m := r.cfg.Metrics
	m.slotLag.Set(float64(lag))
	m.cdc.retainedWAL.Set(float64(retained))
	m.cdc.walKeepSize.Set(keep)
	m.dead.Set(float64(dead))
	return nil
}

func (r *CDCRelay) deleteConfirmed(ctx context.Context) error {
	for ctx.Err() == nil {
		tag, err := r.pool.Exec(ctx, deleteConfirmedBatch, r.cfg.Slot, r.cfg.Retain.Microseconds(), r.cfg.RetentionBatch)
		if err != nil {
			return fmt.Errorf("deleting confirmed outbox rows: %w", err)
		}
		if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
			return nil
		}
	}
	return nil
}
