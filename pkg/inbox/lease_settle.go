package inbox

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Closing a lease: marking its message done or uncertain, or dead-lettering
// it, each in a transaction of its own that outlasts database outages,
// since the side effect is behind it.

// settleLeased runs one of the transactions that close a lease (markDone,
// markUncertain). The side effect is behind it, so it is retried while the
// database is unreachable; other failures are retried MaxAttempts times,
// then logged, and the row stays leased for the reconciliation report.
func (a *leaseApplier) settleLeased(ctx context.Context, d delivery, step string, f func() error) error {
	for attempt, outages := 1, 0; ; {
		err := f()
		switch {
		case err == nil:
			a.db.ok(ctx, "")
			return nil
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			a.db.fail(ctx, step, err)
			outages++
			if err := wait(ctx, d.gen, retry.Backoff(outages, a.cfg.BackoffMin, a.cfg.BackoffMax)); err != nil {
				return err
			}
		case attempt >= a.cfg.MaxAttempts || isPermanent(err):
			a.cfg.Logger.ErrorContext(ctx, "inbox could not settle a lease; its row stays leased for reconciliation",
				slog.String("consumer", a.cfg.Name), slog.String("step", step), slog.Any("error", err))
			return nil
		default:
			if err := wait(ctx, d.gen, retry.Backoff(attempt, a.cfg.BackoffMin, a.cfg.BackoffMax)); err != nil {
				return err
			}
			attempt++
		}
	}
}

// deadLetterLeased dead-letters outside any transaction (deadLetterAlone),
// waiting out the database being unreachable without publishing again.
func (a *leaseApplier) deadLetterLeased(ctx context.Context, d delivery, ev *event.Envelope, reason error) error {
	published := false
	return a.settleLeased(ctx, d, "dead_letter", func() error { return a.deadLetterAlone(ctx, d.m, ev, reason, &published) })
}

// markDone marks the leased row processed, if the lease is still ours, and
// records the outcome with Done in the same transaction.
func (a *leaseApplier) markDone(ctx context.Context, ev event.Envelope, token int64, outcome Outcome) error {
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, markLeaseDone, a.cfg.Name, ev.EventID, token)
		if err != nil {
			return dbErrors.Translate("marking a lease done", err)
		}
		if tag.RowsAffected() == 0 {
			// Our lease expired and another worker took over; it settles the row.
			a.leaseTakenOver(ctx, ev)
			return nil
		}
		return a.recordDone(ctx, tx, []DoneEvent{{Event: ev, Outcome: outcome}})
	})
}

// recordDone runs the Effect's Done for each of done, or its DoneBatch
// once, in tx.
func (a *leaseApplier) recordDone(ctx context.Context, tx pgx.Tx, done []DoneEvent) error {
	if a.effect.DoneBatch != nil {
		if len(done) == 0 {
			return nil
		}
		return a.effect.DoneBatch(ctx, tx, done)
	}
	if a.effect.Done != nil {
		for _, d := range done {
			if err := a.effect.Done(ctx, tx, d.Event, d.Outcome); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *leaseApplier) markUncertain(ctx context.Context, ev event.Envelope, token int64, cause error) error {
	a.cfg.Metrics.uncertain.WithLabelValues(a.cfg.Name).Inc()
	a.cfg.Logger.ErrorContext(ctx, "inbox cannot tell whether the side effect happened; marked uncertain for reconciliation",
		slog.String("consumer", a.cfg.Name), slog.String("event_id", ev.EventID.String()), slog.Any("error", cause))
	if _, err := a.pool.Exec(ctx, markLeaseUncertain, a.cfg.Name, ev.EventID, token, cause.Error()); err != nil {
		return dbErrors.Translate("marking a lease uncertain", err)
	}
	return nil
}
