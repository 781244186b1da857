package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// Closing a lease: marking its message done or uncertain, or dead-lettering
// it, each in a transaction of its own that outlasts database outages,
// since the side effect is behind it.

// errGaveUp says settleLeased stopped retrying a closing transaction that
// kept failing for a reason other than an outage.
var errGaveUp = errors.New("gave up settling a lease")

// settleLeased runs one of the transactions that close a lease (markDone,
// markUncertain, a dead letter's row). The side effect is behind it, so it
// is retried while the database is unreachable; other failures are retried
// MaxAttempts times, then it returns errGaveUp, and the caller decides
// what the row becomes (settleDone: uncertain; otherwise the message is
// abandoned, not committed, and redelivered: a row must never stay leased
// behind an offset that moved on).
func (a *applier) settleLeased(ctx context.Context, d engine.Delivery, step string, f func() error) error {
	for attempt, outages := 1, 0; ; {
		err := f()
		switch {
		case err == nil:
			a.DB.OK(ctx, "")
			return nil
		case ctx.Err() != nil:
			return engine.ErrAbandoned
		case engine.IsOutage(err):
			a.DB.Fail(ctx, step, err)
			outages++
			if err := engine.Wait(ctx, d.Gen, retry.Backoff(outages, a.Config.BackoffMin, a.Config.BackoffMax)); err != nil {
				return err
			}
		case attempt >= a.Config.MaxAttempts || engine.IsPermanent(err):
			a.Config.Logger.ErrorContext(ctx, "inbox could not settle a lease",
				slog.String("consumer", a.Config.Name), slog.String("step", step), slog.Any("error", err))
			return fmt.Errorf("%w: %s: %w", errGaveUp, step, err)
		default:
			if err := engine.Wait(ctx, d.Gen, retry.Backoff(attempt, a.Config.BackoffMin, a.Config.BackoffMax)); err != nil {
				return err
			}
			attempt++
		}
	}
}

// gaveUp turns settleLeased's errGaveUp into errAbandoned: the message is
// not committed, its lease expires, and its redelivery takes it over and
// checks before anything else.
func gaveUp(err error) error {
	if errors.Is(err, errGaveUp) {
		return engine.ErrAbandoned
	}
	return err
}

// settleDone marks a called message done (markDone). When that keeps
// failing (Effect.Done refusing its record, say), the side effect still
// happened: the row is marked uncertain, with why, for the reconciliation
// report, rather than left leased behind an offset that moves on; if even
// that fails, the message is abandoned and redelivered.
func (a *applier) settleDone(ctx context.Context, d engine.Delivery, ev event.Envelope, token int64, outcome Outcome) error {
	err := a.settleLeased(ctx, d, "marking done", func() error { return a.markDone(ctx, ev, token, outcome) })
	if !errors.Is(err, errGaveUp) {
		return err
	}
	cause := fmt.Errorf("the side effect happened (%s) but marking it done failed: %w", outcome, err)
	return gaveUp(a.settleLeased(ctx, d, "marking uncertain", func() error { return a.markUncertain(ctx, ev, token, cause) }))
}

// deadLetterLeased dead-letters outside any transaction (deadLetterAlone),
// under lease, waiting out the database being unreachable without
// publishing again.
func (a *applier) deadLetterLeased(ctx context.Context, d engine.Delivery, ev *event.Envelope, reason error, lease engine.LeaseRef) error {
	var progress engine.DLProgress
	return gaveUp(a.settleLeased(ctx, d, "dead_letter", func() error { return a.DeadLetterAlone(ctx, d.Msg, ev, reason, lease, &progress) }))
}

// markDone marks the leased row processed, if the lease is still ours, and
// records the outcome with Done in the same transaction.
func (a *applier) markDone(ctx context.Context, ev event.Envelope, token int64, outcome Outcome) error {
	return pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		done, err := state.Take(ctx, tx, &state.Done, a.Config.Name, ev.EventID, token)
		if err != nil {
			return engine.DBErrors.Translate("marking a lease done", err)
		}
		if !done {
			// Our lease expired and another worker took over; it settles the row.
			a.Refused(ctx, &state.Done, ev.EventID, "the lease was taken over")
			a.leaseTakenOver(ctx, ev)
			return nil
		}
		return a.recordDone(ctx, tx, []DoneEvent{{Event: ev, Outcome: outcome}})
	})
}

// recordDone runs the Effect's Done for each of done, or its DoneBatch
// once, in tx.
func (a *applier) recordDone(ctx context.Context, tx pgx.Tx, done []DoneEvent) error {
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

// markUncertain marks ev's lease uncertain, under token. It counts and
// logs the mark only once the guarded write changed the row: a holder whose
// lease was taken over marked nothing (a refusal), and counting it would
// report an uncertain message that the new holder may settle.
func (a *applier) markUncertain(ctx context.Context, ev event.Envelope, token int64, cause error) error {
	marked, err := state.Take(ctx, a.Pool, &state.Uncertain, a.Config.Name, ev.EventID, token, cause.Error())
	if err != nil {
		return engine.DBErrors.Translate("marking a lease uncertain", err)
	}
	if !marked {
		a.Refused(ctx, &state.Uncertain, ev.EventID, "the lease was taken over")
		return nil
	}
	engine.Uncertain(a.Config.Metrics).WithLabelValues(a.Config.Name).Inc()
	a.Config.Logger.ErrorContext(ctx, "inbox cannot tell whether the side effect happened; marked uncertain for reconciliation",
		slog.String("consumer", a.Config.Name), slog.String("event_id", ev.EventID.String()), slog.Any("error", cause))
	return nil
}
