package inbox

import (
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
// own: the lease, the side effect, marking it done. Like processAlone, it
// charges a message only for its own failures (its side effect, data
// Postgres refuses), waits out the database (and the Effect's other side)
// being unreachable, and returns errAbandoned when ctx (the shutdown grace)
// ends or the message's generation is dropped, errLeaseLost when another
// worker took its lease over; a crash point firing is a *crashError.
func (a *leaseApplier) processLeased(ctx context.Context, d delivery) error {
	m := d.m
	start := time.Now()
	var counts [numOutcomes]int
	defer func() { a.cfg.Metrics.record(a.cfg.Name, counts, 1, time.Since(start)) }()

	ev, err := event.FromKafka(m)
	if err != nil {
		counts[deadLettered]++
		return a.deadLetterLeased(ctx, d, nil, err, leaseRef{})
	}
	ctx, span := a.startProcess(ctx, m, ev) // covers the lease, the side effect and marking it done
	defer span.End()
	key := ev.EventID.String()

	// Take the lease, waiting out another worker's (perhaps a dead one's).
	var (
		token int64
		taken bool
	)
	for attempt, outages := 1, 0; ; {
		var out *outcome
		token, out, taken, err = a.lease(ctx, m, &ev)
		var held *leaseHeldError
		switch {
		case errors.As(err, &held):
			a.cfg.Logger.InfoContext(ctx, "inbox waits for another worker's lease", slog.String("consumer", a.cfg.Name),
				slog.String("event_id", key), slog.Time("lease_until", held.until))
			if err := wait(ctx, d.gen, time.Until(held.until)+10*time.Millisecond); err != nil {
				return err
			}
			continue // waiting is not failing
		case err == nil && out != nil:
			a.db.ok(ctx, "")
			counts[*out]++ // a duplicate or a stale event: settled without a side effect
			return nil
		case err == nil:
			a.db.ok(ctx, "")
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			a.db.fail(ctx, "lease", err)
			outages++
			if err := wait(ctx, d.gen, retry.Backoff(outages, a.cfg.BackoffMin, a.cfg.BackoffMax)); err != nil {
				return err
			}
			continue
		case attempt >= a.cfg.MaxAttempts || isPermanent(err):
			counts[deadLettered]++
			return a.deadLetterLeased(ctx, d, &ev, err, leaseRef{}) // no lease taken: a new row, or the requeued one
		default:
			if err := wait(ctx, d.gen, retry.Backoff(attempt, a.cfg.BackoffMin, a.cfg.BackoffMax)); err != nil {
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
func (a *leaseApplier) lease(ctx context.Context, m kafka.Message, ev *event.Envelope) (token int64, out *outcome, taken bool, err error) {
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		out, taken = nil, false
		if err := a.watchServer(ctx, tx); err != nil {
			return err
		}
		var takenOver bool // taken says more: or sent before a server switch
		var was []byte     // a reclaimed row as it was, for tRepark
		requeued, err := a.claim(ctx, tx, m, ev, &token, &taken, &takenOver, &was)
		if errors.Is(err, pgx.ErrNoRows) {
			var status string
			var until *time.Time
			if err := tx.QueryRow(ctx, leaseState, a.cfg.Name, ev.EventID).Scan(&status, &until); err != nil {
				return dbErrors.Translate("reading a lease", err)
			}
			if status == "leased" && until != nil {
				return &leaseHeldError{eventID: ev.EventID.String(), until: *until}
			}
			if err := a.checkPayloads(ctx, tx, *ev); err != nil {
				return err
			}
			d := duplicate
			out = &d
			return nil
		}
		if err != nil {
			return dbErrors.Translate("leasing", err)
		}
		if takenOver {
			return a.upcast(ev) // parked and guarded when it was first leased
		}
		pd, err := a.parkCheck(ctx, tx, ev)
		if err != nil {
			return err
		}
		if pd.release {
			a.released.add(aggregateKey{ev.AggregateType, ev.AggregateID})
		}
		switch pd.verdict {
		case parkIt, alreadyParked:
			// Not leased after all: no inbox row, so that its release leases it;
			// but a reclaimed requeued row (a stale dead letter's requeue,
			// which holds nothing, behind another dead message) is put back
			// requeued, never deleted: its release reclaims it.
			tr, args := &tUnlease, []any{a.cfg.Name, ev.EventID, token}
			if requeued {
				tr, args = &tRepark, []any{a.cfg.Name, ev.EventID, was, token}
			}
			if _, err := take(ctx, tx, tr, args...); err != nil {
				return dbErrors.Translate("parking a message", err)
			}
			o := duplicate
			if pd.verdict == parkIt {
				o = parked
				if err := a.park(ctx, tx, m, ev, pd.blockedBy); err != nil {
					return err
				}
			}
			out = &o
			return nil
		case proceedRequeued:
			if _, err := take(ctx, tx, &tDropHold, a.cfg.Name, ev.EventID); err != nil {
				return dbErrors.Translate("releasing a requeued message's aggregate", err)
			}
		}
		if !a.cfg.DisableVersionGuard {
			isStale, err := a.guardVersion(ctx, tx, ev, pd.verdict == proceedRequeued || requeued)
			if err != nil {
				return err
			}
			if isStale {
				s := stale
				out = &s
				return nil
			}
		}
		return a.upcast(ev)
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
func (a *leaseApplier) claim(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, token *int64, taken, takenOver *bool, was *[]byte) (requeued bool, err error) {
	reclaim := func() error {
		return tx.QueryRow(ctx, tReclaim.sql, a.cfg.Name, ev.EventID, a.leaseCfg.LeaseOwner, a.leaseCfg.LeaseTTL.Microseconds()).
			Scan(token, taken, was)
	}
	if err := reclaim(); !errors.Is(err, pgx.ErrNoRows) {
		return err == nil, err
	}
	err = tx.QueryRow(ctx, tLease.sql, a.cfg.Name, ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
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
