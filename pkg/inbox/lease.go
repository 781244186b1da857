package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
)

// ErrUnknowable is what Effect.Check returns when the other side cannot say
// whether it already has an idempotency key.
var ErrUnknowable = errors.New("cannot tell whether the side effect happened")

// Outcome is how a leased message's side effect was settled.
type Outcome string

// The outcomes Effect.Done is told about.
const (
	// Sent: this delivery performed the side effect.
	Sent Outcome = "sent"
	// AlreadyPresent: an earlier delivery performed it (and then crashed or
	// timed out before marking done); the other side confirmed the key.
	AlreadyPresent Outcome = "already_present"
)

// Effect is a side effect outside the database, such as a call to a third
// party that cannot be made idempotent. The consumer runs it in lease mode:
//
//  1. claim the message: its inbox row becomes 'leased' to this worker until
//     LeaseTTL from now, with a fencing token that grows with every lease;
//  2. call out with the event id as the idempotency key;
//  3. mark the row done, only if the fencing token is still this worker's,
//     and run Done in that same transaction.
//
// If a worker dies between 2 and 3, the lease expires and the next delivery
// takes it over. It must not call blindly: it first asks Check. Found: the
// row is marked done as AlreadyPresent without calling. Not found: it calls.
// Unknowable: the row is marked 'uncertain' for the reconciliation report and
// nothing is called. The same check precedes every retry after a failed Call,
// since a timed-out call may have landed.
type Effect struct {
	// Check asks the other side whether it already has key. Return
	// ErrUnknowable when it cannot answer. Required.
	Check func(ctx context.Context, key string) (bool, error)
	// Call performs the side effect, passing key along. An error wrapping
	// ErrPermanent dead-letters the message; others are retried. Required.
	Call func(ctx context.Context, ev event.Envelope, key string) error
	// Done records the outcome in the consumer's database, in the
	// transaction that marks the message done. Optional.
	Done func(ctx context.Context, tx pgx.Tx, ev event.Envelope, outcome Outcome) error
}

// CrashAfterEffect is the crash point between a leased message's side effect
// and marking it done.
const CrashAfterEffect = "inbox.after-effect"

// NewLeaseConsumer returns a consumer that runs eff for each event in lease
// mode (see Effect). Dedupe, the version guard, upcasters, dead letters,
// workers and offsets work as in NewConsumer; each message is its own
// sequence of short transactions instead of part of a batch.
func NewLeaseConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, eff Effect, cfg Config) (*Consumer, error) {
	if eff.Check == nil || eff.Call == nil {
		return nil, errors.New("inbox: an Effect needs Check and Call")
	}
	noHandler := func(context.Context, pgx.Tx, event.Envelope) error { return nil }
	c, err := NewConsumer(pool, src, dlq, noHandler, cfg)
	if err != nil {
		return nil, err
	}
	c.effect = &eff
	return c, nil
}

// claimLease takes the message's inbox row: a new row, or an expired lease
// of a worker that died. It returns the fencing token and whether an earlier
// lease existed (so the side effect may have happened already).
const claimLease = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash,
                            lease_owner, lease_until, fencing_token)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'leased', sha256($9), $10, now() + $11 * interval '1 microsecond', 1)
ON CONFLICT (consumer, message_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until,
    fencing_token = inbox_messages.fencing_token + 1, attempts = inbox_messages.attempts + 1
WHERE inbox_messages.status = 'leased' AND inbox_messages.lease_until < now()
RETURNING fencing_token, fencing_token > 1`

// processLeased settles one message in lease mode. Like processAlone, it
// charges a message only for its own failures (its side effect, data
// Postgres refuses), waits out the database being unreachable, and returns
// errAbandoned when ctx (the shutdown grace) ends or the message's
// generation is dropped; a crash point firing is a *crashError.
func (c *Consumer) processLeased(ctx context.Context, d delivery) error {
	m := d.m
	start := time.Now()
	var counts [4]int
	defer func() { c.cfg.Metrics.record(c.cfg.Name, counts, 1, time.Since(start)) }()

	ev, err := event.FromKafka(m)
	if err != nil {
		counts[deadLettered]++
		return c.deadLetterLeased(ctx, d, nil, err)
	}
	ctx, span := c.startProcess(ctx, m, ev) // covers the lease, the side effect and marking it done
	defer span.End()
	key := ev.EventID.String()

	// Take the lease, waiting out another worker's (perhaps a dead one's).
	var (
		token int64
		taken bool
	)
	for attempt, outages := 1, 0; ; {
		var out *outcome
		token, out, taken, err = c.lease(ctx, m, &ev)
		var held *leaseHeldError
		switch {
		case errors.As(err, &held):
			c.cfg.Logger.InfoContext(ctx, "inbox waits for another worker's lease", slog.String("consumer", c.cfg.Name),
				slog.String("event_id", key), slog.Time("lease_until", held.until))
			if err := wait(ctx, d.gen, time.Until(held.until)+10*time.Millisecond); err != nil {
				return err
			}
			continue // waiting is not failing
		case err == nil && out != nil:
			c.db.ok(ctx, "")
			counts[*out]++ // a duplicate or a stale event: settled without a side effect
			return nil
		case err == nil:
			c.db.ok(ctx, "")
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			c.db.fail(ctx, "lease", err)
			outages++
			if err := wait(ctx, d.gen, retry.Backoff(outages, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
				return err
			}
			continue
		case attempt >= c.cfg.MaxAttempts || isPermanent(err):
			counts[deadLettered]++
			return c.deadLetterLeased(ctx, d, &ev, err)
		default:
			if err := wait(ctx, d.gen, retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
				return err
			}
			attempt++
			continue
		}
		break
	}

	// Run the side effect under the lease, retrying with backoff.
	mayHaveCalled := taken // an expired lease: its holder may have called
	for attempt := 1; ; attempt++ {
		outcome, err := c.runEffect(ctx, ev, key, mayHaveCalled)
		switch {
		case errors.Is(err, ErrUnknowable):
			return c.settleLeased(ctx, d, "marking uncertain", func() error { return c.markUncertain(ctx, ev, token, err) })
		case err == nil:
			if c.cfg.CrashPoint != nil {
				if err := c.cfg.CrashPoint(CrashAfterEffect); err != nil {
					return &crashError{fmt.Errorf("crash point %s: %w", CrashAfterEffect, err)}
				}
			}
			counts[processed]++
			return c.settleLeased(ctx, d, "marking done", func() error { return c.markDone(ctx, ev, token, outcome) })
		}
		if ctx.Err() != nil {
			return errAbandoned
		}
		mayHaveCalled = true // a failed call may still have landed
		c.cfg.Metrics.failures.WithLabelValues(c.cfg.Name).Inc()
		permanent := isPermanent(err)
		if permanent || attempt >= c.cfg.MaxAttempts {
			if !permanent {
				err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
			}
			counts[deadLettered]++
			return c.deadLetterLeased(ctx, d, &ev, err)
		}
		delay := retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)
		c.cfg.Logger.WarnContext(ctx, "inbox side effect failed; retrying", slog.String("consumer", c.cfg.Name),
			slog.String("event_id", key), slog.Int("attempt", attempt), slog.Duration("retry_in", delay), slog.Any("error", err))
		if err := wait(ctx, d.gen, delay); err != nil {
			return err
		}
		// Keep the lease while retrying, so no other worker takes it over.
		// If the database is away, the lease may lapse; the fencing token
		// then keeps a late markDone from overwriting the new holder's work.
		if _, err := c.pool.Exec(ctx, `
			UPDATE inbox_messages SET lease_until = now() + $4 * interval '1 microsecond'
			WHERE consumer = $1 AND message_id = $2 AND fencing_token = $3 AND status = 'leased'`,
			c.cfg.Name, ev.EventID, token, c.cfg.LeaseTTL.Microseconds()); err != nil && ctx.Err() == nil {
			c.db.fail(ctx, "renew_lease", err)
		}
	}
}

// settleLeased runs one of the transactions that close a lease (markDone,
// markUncertain). The side effect is behind it, so it is retried while the
// database is unreachable; other failures are retried MaxAttempts times,
// then logged, and the row stays leased for the reconciliation report.
func (c *Consumer) settleLeased(ctx context.Context, d delivery, step string, f func() error) error {
	for attempt, outages := 1, 0; ; {
		err := f()
		switch {
		case err == nil:
			c.db.ok(ctx, "")
			return nil
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			c.db.fail(ctx, step, err)
			outages++
			if err := wait(ctx, d.gen, retry.Backoff(outages, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
				return err
			}
		case attempt >= c.cfg.MaxAttempts || isPermanent(err):
			c.cfg.Logger.ErrorContext(ctx, "inbox could not settle a lease; its row stays leased for reconciliation",
				slog.String("consumer", c.cfg.Name), slog.String("step", step), slog.Any("error", err))
			return nil
		default:
			if err := wait(ctx, d.gen, retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
				return err
			}
			attempt++
		}
	}
}

// deadLetterLeased dead-letters in a transaction of its own, waiting out
// the database being unreachable.
func (c *Consumer) deadLetterLeased(ctx context.Context, d delivery, ev *event.Envelope, reason error) error {
	return c.settleLeased(ctx, d, "dead_letter", func() error { return c.deadLetterAlone(ctx, d.m, ev, reason) })
}

// lease claims the message. A non-nil outcome means it needs no side effect
// (duplicate or stale); an error means another worker holds a live lease or
// the database failed, and the caller retries.
func (c *Consumer) lease(ctx context.Context, m kafka.Message, ev *event.Envelope) (token int64, out *outcome, taken bool, err error) {
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, claimLease, c.cfg.Name, ev.EventID, ev.EventType, ev.AggregateID, ev.AggregateVersion,
			m.Topic, m.Partition, m.Offset, []byte(ev.Payload), c.cfg.LeaseOwner, c.cfg.LeaseTTL.Microseconds()).Scan(&token, &taken)
		if errors.Is(err, pgx.ErrNoRows) {
			var status string
			var until *time.Time
			if err := tx.QueryRow(ctx, `SELECT status, lease_until FROM inbox_messages WHERE consumer = $1 AND message_id = $2`,
				c.cfg.Name, ev.EventID).Scan(&status, &until); err != nil {
				return err
			}
			if status == "leased" && until != nil {
				return &leaseHeldError{eventID: ev.EventID.String(), until: *until}
			}
			if err := c.checkPayloads(ctx, tx, *ev); err != nil {
				return err
			}
			d := duplicate
			out = &d
			return nil
		}
		if err != nil {
			return fmt.Errorf("leasing: %w", err)
		}
		if !taken && !c.cfg.DisableVersionGuard {
			isStale, err := c.guardVersion(ctx, tx, ev)
			if err != nil {
				return err
			}
			if isStale {
				s := stale
				out = &s
				return nil
			}
		}
		return c.upcast(ev)
	})
	return token, out, taken, err
}

// leaseHeldError says another worker holds the message's lease until until.
type leaseHeldError struct {
	eventID string
	until   time.Time
}

func (e *leaseHeldError) Error() string {
	return fmt.Sprintf("event %s is leased to another worker until %s", e.eventID, e.until.Format(time.RFC3339Nano))
}

// runEffect checks first when an earlier attempt may have called, then calls.
func (c *Consumer) runEffect(ctx context.Context, ev event.Envelope, key string, mayHaveCalled bool) (Outcome, error) {
	if mayHaveCalled {
		has, err := c.effect.Check(ctx, key)
		if err != nil {
			return "", err
		}
		if has {
			c.cfg.Logger.WarnContext(ctx, "the side effect already happened; marking it done without repeating it",
				slog.String("consumer", c.cfg.Name), slog.String("event_id", key))
			return AlreadyPresent, nil
		}
	}
	return Sent, c.effect.Call(ctx, ev, key)
}

// markDone marks the leased row processed, if the lease is still ours, and
// records the outcome with Done in the same transaction.
func (c *Consumer) markDone(ctx context.Context, ev event.Envelope, token int64, outcome Outcome) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			UPDATE inbox_messages SET status = 'processed', processed_at = now(), lease_owner = NULL, lease_until = NULL
			WHERE consumer = $1 AND message_id = $2 AND status = 'leased' AND fencing_token = $3`,
			c.cfg.Name, ev.EventID, token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			// Our lease expired and another worker took over; it settles the row.
			c.cfg.Logger.WarnContext(ctx, "inbox lease was taken over; leaving the row to the new holder",
				slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()))
			return nil
		}
		if c.effect.Done != nil {
			return c.effect.Done(ctx, tx, ev, outcome)
		}
		return nil
	})
}

func (c *Consumer) markUncertain(ctx context.Context, ev event.Envelope, token int64, cause error) error {
	c.cfg.Metrics.uncertain.WithLabelValues(c.cfg.Name).Inc()
	c.cfg.Logger.ErrorContext(ctx, "inbox cannot tell whether the side effect happened; marked uncertain for reconciliation",
		slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()), slog.Any("error", cause))
	_, err := c.pool.Exec(ctx, `
		UPDATE inbox_messages SET status = 'uncertain', last_error = $4, lease_owner = NULL, lease_until = NULL
		WHERE consumer = $1 AND message_id = $2 AND fencing_token = $3`,
		c.cfg.Name, ev.EventID, token, cause.Error())
	return err
}

// deadLetterAlone dead-letters outside a batch, in a transaction of its own.
func (c *Consumer) deadLetterAlone(ctx context.Context, m kafka.Message, ev *event.Envelope, reason error) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.deadLetter(ctx, tx, m, ev, reason) })
}
