package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// renew extends the lease of id if token still holds it.
func (a *applier) renew(ctx context.Context, id uuid.UUID, token int64) error {
	renewed, err := state.Take(ctx, a.Pool, &state.Renew, a.Config.Name, id, token, a.leaseCfg.LeaseTTL.Microseconds())
	switch {
	case err != nil:
		return engine.DBErrors.Translate("renewing a lease", err)
	case !renewed:
		a.Refused(ctx, &state.Renew, id, "the lease was taken over")
		return errLeaseLost
	}
	return nil
}

// The op label of inbox_effect_errors_total.
const (
	opCheck = "check"
	opCall  = "call"
)

// underLease runs ev's side effect under the lease token, retrying with
// backoff, checking first whenever an earlier attempt may have called
// (taken: an expired lease was taken over; or a call of this worker
// failed, since a failed call may still have landed). The other side being
// unavailable (ErrUnavailable) is waited out without counting an attempt.
// It returns the outcome to mark done with; settled when the message needs
// no marking done (marked uncertain, or dead-lettered); errLeaseLost when
// another worker took the message over, errAbandoned, or a *crashError.
//
// leasedAt is when the transaction that took the lease began (zero: not
// known); see callUnderLease.
func (a *applier) underLease(ctx context.Context, d engine.Delivery, ev event.Envelope, token int64, taken bool, leasedAt time.Time, counts *[engine.NumOutcomes]int) (Outcome, bool, error) {
	key := ev.EventID.String()
	mayHaveCalled := taken
	var failedAt time.Time // when this worker's last failed call returned
	engine.ObserveHop(a.Config.Metrics, a.Config.Name, ev.OccurredAt)
	for attempt, outages := 1, 0; ; {
		if !failedAt.IsZero() {
			// That call may still land up to LeaseMargin after it returned;
			// a check any sooner could miss it and call again.
			if err := engine.Wait(ctx, d.Gen, time.Until(failedAt.Add(a.leaseCfg.LeaseMargin))); err != nil {
				return "", false, err
			}
		}
		outcome, op, err := a.runEffect(ctx, d.Gen, ev, token, leasedAt, key, mayHaveCalled)
		if op == opCall && err != nil {
			mayHaveCalled, failedAt = true, time.Now()
		}
		switch {
		case errors.Is(err, errLeaseLost):
			a.leaseTakenOver(ctx, ev)
			return "", false, err
		case errors.Is(err, engine.ErrAbandoned):
			return "", false, err
		case errors.Is(err, ErrUnknowable):
			a.other.OK(ctx, "")
			return "", true, gaveUp(a.settleLeased(ctx, d, "marking uncertain", func() error { return a.markUncertain(ctx, ev, token, err) }))
		case err == nil:
			a.other.OK(ctx, "")
			if err := faultpoint.Pass(ctx, faultpoint.InboxAfterEffect); err != nil {
				return "", false, &engine.CrashError{Err: err}
			}
			counts[engine.Processed]++
			return outcome, false, nil
		case ctx.Err() != nil:
			return "", false, engine.ErrAbandoned
		case errors.Is(err, ErrUnavailable):
			a.other.Fail(ctx, op, err)
			outages++
			if err := engine.Wait(ctx, d.Gen, retry.Backoff(outages, a.Config.BackoffMin, a.Config.BackoffMax)); err != nil {
				return "", false, err
			}
			continue
		}
		a.other.OK(ctx, op) // it answered: reachable, and the failure is the message's
		engine.Failures(a.Config.Metrics).WithLabelValues(a.Config.Name).Inc()
		permanent := engine.IsPermanent(err)
		if permanent || attempt >= a.Config.MaxAttempts {
			if !permanent {
				err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
			}
			counts[engine.DeadLettered]++
			return "", true, a.deadLetterLeased(ctx, d, &ev, err, engine.LeaseRef{Token: token, MayHaveCalled: mayHaveCalled})
		}
		delay := retry.Backoff(attempt, a.Config.BackoffMin, a.Config.BackoffMax)
		a.Config.Logger.WarnContext(ctx, "inbox side effect failed; retrying", slog.String("consumer", a.Config.Name),
			slog.String("event_id", key), slog.Int("attempt", attempt), slog.Duration("retry_in", delay), slog.Any("error", err))
		if err := engine.Wait(ctx, d.Gen, delay); err != nil {
			return "", false, err
		}
		attempt++
	}
}

// runEffect checks first when an earlier attempt may have called, then
// calls, each under the lease (callUnderLease). op says which of the two
// the error came from.
func (a *applier) runEffect(ctx context.Context, gen engine.Tracker, ev event.Envelope, token int64, leasedAt time.Time, key string, mayHaveCalled bool) (Outcome, string, error) {
	if mayHaveCalled {
		var has bool
		err := a.callUnderLease(ctx, gen, ev.EventID, token, leasedAt, func(ctx context.Context) (err error) {
			has, err = a.effect.Check(ctx, key)
			return err
		})
		if err != nil {
			return "", opCheck, err
		}
		if has {
			a.Config.Logger.WarnContext(ctx, "the side effect already happened; marking it done without repeating it",
				slog.String("consumer", a.Config.Name), slog.String("event_id", key))
			return AlreadyPresent, "", nil
		}
	}
	err := a.callUnderLease(ctx, gen, ev.EventID, token, leasedAt, func(ctx context.Context) error { return a.effect.Call(ctx, ev, key) })
	return Sent, opCall, err
}

// freshLeaseShare: a call that starts within CallTimeout/freshLeaseShare of
// the transaction that took its lease runs under that lease as it is (see
// callUnderLease).
const freshLeaseShare = 10

// callUnderLease runs f, a call to the other side, only while this worker
// holds the lease of id: it takes one of the MaxInFlight call slots (a wait
// of any length, during which the lease may lapse), renews the lease under
// token, waiting out the database being unreachable, and then runs f with a
// ctx that ends CallTimeout after the renewal began — so before the lease,
// renewed for LeaseTTL, can expire, by LeaseTTL - CallTimeout (at least
// LeaseMargin, which Validate enforces). The renewal is the check: a
// renewal that succeeds late is still safe, since the token proves nobody
// took the message over meanwhile. It returns errLeaseLost when somebody
// did, errAbandoned when ctx ends or gen is dropped, and an error wrapping
// ErrUnavailable when f outlived CallTimeout.
//
// A lease taken less than CallTimeout/freshLeaseShare ago (leasedAt, when
// its transaction began) needs no renewal: taking it was one, under the same
// token, and nobody can have taken it over before it expires. f then runs
// with a ctx that ends CallTimeout after leasedAt, as it would after a
// renewal begun then. So the first call of each message of a batch costs no
// round trip and no commit of its own (BENCHMARKS.md, issue 23: at 300
// payments a second the shim's renewals queued for its pool's connections).
func (a *applier) callUnderLease(ctx context.Context, gen engine.Tracker, id uuid.UUID, token int64, leasedAt time.Time, f func(context.Context) error) error {
	select {
	case a.calls <- struct{}{}:
	case <-ctx.Done():
		return engine.ErrAbandoned
	}
	defer func() { <-a.calls }()
	renewed := leasedAt
	if leasedAt.IsZero() || time.Since(leasedAt) >= a.leaseCfg.CallTimeout/freshLeaseShare {
		var err error
		if renewed, err = a.renewForCall(ctx, gen, id, token); err != nil {
			return err
		}
	} else if gen != nil && gen.IsDropped() {
		return engine.ErrAbandoned
	}
	callCtx, cancel := context.WithDeadline(ctx, renewed.Add(a.leaseCfg.CallTimeout))
	defer cancel()
	err := f(callCtx)
	if err != nil && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: no answer within CallTimeout (%v): %w", ErrUnavailable, a.leaseCfg.CallTimeout, err)
	}
	return err
}

// renewForCall renews the lease of id under token before a call, waiting
// out the database being unreachable, and returns when the renewal began.
func (a *applier) renewForCall(ctx context.Context, gen engine.Tracker, id uuid.UUID, token int64) (time.Time, error) {
	for outages := 1; ; outages++ {
		if gen != nil && gen.IsDropped() {
			return time.Time{}, engine.ErrAbandoned
		}
		renewed := time.Now() // before the renewal: the lease runs from no earlier
		err := a.renew(ctx, id, token)
		if err == nil {
			if outages > 1 {
				a.DB.OK(ctx, "renew_lease")
			}
			return renewed, nil
		}
		switch {
		case errors.Is(err, errLeaseLost):
			return time.Time{}, err
		case ctx.Err() != nil:
			return time.Time{}, engine.ErrAbandoned
		}
		a.DB.Fail(ctx, "renew_lease", err)
		if err := engine.Wait(ctx, gen, retry.Backoff(outages, a.Config.BackoffMin, a.Config.BackoffMax)); err != nil {
			return time.Time{}, err
		}
	}
}

// Health describes an outage of the Effect's other side, nil when there is
// none.
func (a *applier) Health() error { return a.other.Err() }
