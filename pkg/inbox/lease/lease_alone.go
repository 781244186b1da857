package lease

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// processLeased settles one message in lease mode, in transactions of its
// own: the lease, the side effect, marking it done. Like the transactional applier's processAlone, it
// charges a message only for its own failures (its side effect, data
// Postgres refuses), waits out the database (and the Effect's other side)
// being unreachable, and returns errAbandoned when ctx (the shutdown grace)
// ends or the message's generation is dropped, errLeaseLost when another
// worker took its lease over; a crash point firing is a *crashError.
func (a *applier) processLeased(ctx context.Context, d engine.Delivery) error {
	m := d.Msg
	start := time.Now()
	var counts [engine.NumOutcomes]int
	defer func() { engine.Record(a.Config.Metrics, a.Config.Name, counts, 1, time.Since(start)) }()

	ev, err := event.FromKafka(m)
	if err != nil {
		counts[engine.DeadLettered]++
		return a.deadLetterLeased(ctx, d, nil, err, engine.LeaseRef{})
	}
	ctx, span := a.StartProcess(ctx, m, ev) // covers the lease, the side effect and marking it done
	defer span.End()
	key := ev.EventID.String()

	// Take the lease, waiting out another worker's (perhaps a dead one's).
	var (
		token int64
		taken bool
	)
	for attempt, outages := 1, 0; ; {
		var out *engine.Outcome
		token, out, taken, err = a.lease(ctx, m, &ev)
		var held *leaseHeldError
		switch {
		case errors.As(err, &held):
			a.Config.Logger.InfoContext(ctx, "inbox waits for another worker's lease", slog.String("consumer", a.Config.Name),
				slog.String("event_id", key), slog.Time("lease_until", held.until))
			if err := engine.Wait(ctx, d.Gen, time.Until(held.until)+10*time.Millisecond); err != nil {
				return err
			}
			continue // waiting is not failing
		case err == nil && out != nil:
			a.DB.OK(ctx, "")
			counts[*out]++ // a duplicate or a stale event: settled without a side effect
			return nil
		case err == nil:
			a.DB.OK(ctx, "")
		case ctx.Err() != nil:
			return engine.ErrAbandoned
		case engine.IsOutage(err):
			a.DB.Fail(ctx, "lease", err)
			outages++
			if err := engine.Wait(ctx, d.Gen, retry.Backoff(outages, a.Config.BackoffMin, a.Config.BackoffMax)); err != nil {
				return err
			}
			continue
		case attempt >= a.Config.MaxAttempts || engine.IsPermanent(err):
			counts[engine.DeadLettered]++
			return a.deadLetterLeased(ctx, d, &ev, err, engine.LeaseRef{}) // no lease taken: a new row, or the requeued one
		default:
			if err := engine.Wait(ctx, d.Gen, retry.Backoff(attempt, a.Config.BackoffMin, a.Config.BackoffMax)); err != nil {
				return err
			}
			attempt++
			continue
		}
		break
	}
	outcome, settled, err := a.underLease(ctx, d, ev, token, taken, time.Time{}, &counts)
	if err != nil || settled {
		return err
	}
	return a.settleDone(ctx, d, ev, token, outcome)
}

// lease claims the message: a requeued letter (reclaim), a new row or an
// expired lease (lease). taken says an earlier call may have landed (a
// takeover, a requeued letter whose last call failed, or a message sent
// before the database server switched, lease_server.go), so the effect
// checks before calling. A non-nil outcome means it needs no side effect
// (duplicate or stale); an error means another worker holds a live lease or
// the database failed, and the caller retries.
func (a *applier) lease(ctx context.Context, m kafka.Message, ev *event.Envelope) (token int64, out *engine.Outcome, taken bool, err error) {
	err = pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		out, taken = nil, false
		if err := a.watchServer(ctx, tx); err != nil {
			return err
		}
		var takenOver bool // taken says more: or sent before a server switch
		var was []byte     // a reclaimed row as it was, for state.Repark
		requeued, err := a.claim(ctx, tx, m, ev, &token, &taken, &takenOver, &was)
		if errors.Is(err, pgx.ErrNoRows) {
			var status string
			var until *time.Time
			if err := tx.QueryRow(ctx, leaseState, a.Config.Name, ev.EventID).Scan(&status, &until); err != nil {
				return engine.DBErrors.Translate("reading a lease", err)
			}
			if status == "leased" && until != nil {
				return &leaseHeldError{eventID: ev.EventID.String(), until: *until}
			}
			if err := a.CheckPayloads(ctx, tx, *ev); err != nil {
				return err
			}
			d := engine.Duplicate
			out = &d
			return nil
		}
		if err != nil {
			return engine.DBErrors.Translate("leasing", err)
		}
		if takenOver {
			return a.Upcast(ev) // parked and guarded when it was first leased
		}
		pd, err := a.ParkCheck(ctx, tx, ev)
		if err != nil {
			return err
		}
		if pd.Release {
			a.Released.Add(engine.AggregateKey{Type: ev.AggregateType, ID: ev.AggregateID})
		}
		switch pd.Verdict {
		case engine.ParkIt, engine.AlreadyParked:
			// Not leased after all: no inbox row, so that its release leases it;
			// but a reclaimed requeued row (a stale dead letter's requeue,
			// which holds nothing, behind another dead message) is put back
			// requeued, never deleted: its release reclaims it.
			tr, args := &state.Unlease, []any{a.Config.Name, ev.EventID, token}
			if requeued {
				tr, args = &state.Repark, []any{a.Config.Name, ev.EventID, was, token}
			}
			if _, err := state.Take(ctx, tx, tr, args...); err != nil {
				return engine.DBErrors.Translate("parking a message", err)
			}
			o := engine.Duplicate
			if pd.Verdict == engine.ParkIt {
				o = engine.ParkedOutcome
				if err := a.Park(ctx, tx, m, ev, pd.BlockedBy); err != nil {
					return err
				}
			}
			out = &o
			return nil
		case engine.ProceedRequeued:
			if _, err := state.Take(ctx, tx, &state.DropHold, a.Config.Name, ev.EventID); err != nil {
				return engine.DBErrors.Translate("releasing a requeued message's aggregate", err)
			}
		}
		if !a.Config.DisableVersionGuard {
			isStale, err := a.GuardVersion(ctx, tx, ev, pd.Verdict == engine.ProceedRequeued || requeued)
			if err != nil {
				return err
			}
			if isStale {
				s := engine.Stale
				out = &s
				return nil
			}
		}
		return a.Upcast(ev)
	})
	return token, out, taken, err
}

// claim takes the message's row in tx: a requeued letter (reclaim, which
// reports requeued), else a new row or an expired lease (lease). It returns
// pgx.ErrNoRows when neither applies (settled, or leased to a live worker).
//
// A requeue sends the letter before it commits the row's requeued state, so
// the redelivery can come first: the reclaim, reading the row as it was,
// finds nothing, and the lease's INSERT waits on the requeue's row lock,
// then finds the row requeued, which it does not take. The reclaim then
// runs again, and takes it (found by the interleaving checker:
// TestInterleavingsOfARequeueAfterACallThatMayHaveLanded).
//
// taken says a call may have landed; takenOver that this is the takeover of
// an expired lease (tLease); was the reclaimed row as it was.
func (a *applier) claim(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, token *int64, taken, takenOver *bool, was *[]byte) (requeued bool, err error) {
	reclaim := func() error {
		return tx.QueryRow(ctx, state.Reclaim.SQL, a.Config.Name, ev.EventID, a.leaseCfg.LeaseOwner, a.leaseCfg.LeaseTTL.Microseconds()).
			Scan(token, taken, was)
	}
	if err := reclaim(); !errors.Is(err, pgx.ErrNoRows) {
		return err == nil, err
	}
	err = tx.QueryRow(ctx, state.Lease.SQL, a.Config.Name, ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
		m.Topic, m.Partition, m.Offset, []byte(ev.Payload), a.leaseCfg.LeaseOwner, a.leaseCfg.LeaseTTL.Microseconds(), m.Time).
		Scan(token, takenOver, taken)
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}
	if err := reclaim(); !errors.Is(err, pgx.ErrNoRows) {
		return err == nil, err
	}
	return false, pgx.ErrNoRows
}

// leaseHeldError says another worker holds the message's lease until until.
type leaseHeldError struct {
	eventID string
	until   time.Time
}

func (e *leaseHeldError) Error() string {
	return fmt.Sprintf("event %s is leased to another worker until %s", e.eventID, e.until.Format(time.RFC3339Nano))
}
