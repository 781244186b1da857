package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
)

func (r *Relay) every(ctx context.Context, interval time.Duration, o *outage.Outage, op string, f func(context.Context) error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		err := f(callCtx)
		cancel()
		switch {
		case err == nil:
			o.OK(ctx)
		case ctx.Err() == nil:
			r.cfg.Metrics.DbErrors.WithLabelValues(op).Inc()
			o.Fail(ctx, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// refreshGauges reads the slot's gauges (readSlot, shared with
// Metrics.WatchSlot) and sets them.
func (r *Relay) refreshGauges(ctx context.Context) error {
	s, err := metrics.ReadSlot(ctx, r.pool, r.cfg.Slot)
	if err != nil {
		return err
	}
	set(r.cfg.Metrics).SetSlot(s)
	return nil
}

// deleteConfirmed moves the slot record's horizon (horizonXid, then
// advanceHorizon), then deletes what is published (lifecycle.PublishedCDC) and older
// than Retain, in batches.
func (r *Relay) deleteConfirmed(ctx context.Context) error {
	var xid string
	if err := r.pool.QueryRow(ctx, horizonXid).Scan(&xid); err != nil {
		return fmt.Errorf("reading this database's horizon: %w", err)
	}
	if _, err := r.pool.Exec(ctx, advanceHorizon, r.cfg.Slot, xid); err != nil {
		return fmt.Errorf("moving the slot's published horizon: %w", err)
	}
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

// set is m as the internal set the relays move (outbox.Metrics is a type of
// it).
func set(m *outbox.Metrics) *metrics.Metrics { return (*metrics.Metrics)(m) }
