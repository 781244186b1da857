package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/pgerr"
)

// Handler applies one event's side effects using tx, the transaction the
// inbox row is written in. It must not commit or roll back tx. An error
// wrapping ErrPermanent or event.ErrInvalid dead-letters the event at once;
// any other error is retried.
type Handler func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// BatchHandler is a handler that can also apply the new events of a batch
// at once, so that what it writes for them takes a statement or two instead
// of a few per event (NewBatchConsumer).
type BatchHandler interface {
	// Handle applies one event, as a Handler does; the consumer calls it
	// for each message it settles on its own (a batch that failed, a
	// retry, a dead letter's replay).
	Handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error
	// HandleBatch applies evs, new events of one batch in the order they
	// were fetched, in tx: exactly what Handle would do for each, one after
	// the other. Each comes with the context of its consumer span, the
	// trace its effects continue. It must not commit or roll back tx. An
	// error rolls the batch back, and the consumer then settles its
	// messages one by one with Handle.
	HandleBatch(ctx context.Context, tx pgx.Tx, evs []Applying) error
}

// Applying is one event a BatchHandler applies, with the context of its
// consumer span (a context per event, which is why it travels in a struct).
type Applying struct {
	Ctx   context.Context
	Event event.Envelope
}

// txApplier is the transactional applier, NewConsumer's: each message's
// inbox row, version guard and handler commit in one transaction, a batch
// of messages in as few transactions as it can (process), the fast path
// first (txapply_fast.go); both paths run the handler the same way
// (txapply_handle.go).
type txApplier struct {
	*shared
	handle Handler
	// handleBatch applies a batch's new events at once on the fast path
	// (NewBatchConsumer); nil: handle, one by one.
	handleBatch func(ctx context.Context, tx pgx.Tx, evs []Applying) error
}

// process handles batch in as few transactions as it can: one, unless
// a message fails transiently or is to be dead-lettered; then what came
// before it commits, it is retried alone with backoff or dead-lettered with
// no transaction open (dueDeadLetter), and the rest continues in a new
// transaction.
// Every message of batch is finished (done or abandoned) when it returns.
func (a *txApplier) process(ctx context.Context, batch []delivery) (err error) {
	defer func() {
		for _, d := range batch {
			d.gen.finish(d.m, false)
		}
	}()
	for len(batch) > 0 {
		n, due := a.tryBatch(ctx, batch)
		if err := a.committed(ctx, batch[:n]); err != nil {
			batch = batch[n:]
			return err
		}
		batch = batch[n:]
		if len(batch) == 0 {
			return nil
		}
		var aloneErr error
		if due != nil {
			aloneErr = a.deadLetterSettled(ctx, batch[0], due)
		} else {
			aloneErr = a.processAlone(ctx, batch[0])
		}
		if aloneErr != nil {
			if ctx.Err() != nil {
				return aloneErr
			}
			// Its generation was dropped; the others may be of a newer one.
			// The later messages of its key in its generation go with it:
			// applied now, they would make the redelivered one look stale.
			batch = abandonKey(batch)
			continue
		}
		err := a.committed(ctx, batch[:1])
		batch = batch[1:]
		if err != nil {
			return err
		}
	}
	return nil
}

// health is nil: the transactional applier calls nothing but the database,
// whose outages the dispatcher reports.
func (a *txApplier) health() error { return nil }

// abandonKey finishes batch[0] unfinished, with every later message of its
// key and generation, and returns the rest of the batch in order.
func abandonKey(batch []delivery) []delivery {
	first := batch[0]
	first.gen.finish(first.m, false)
	rest := make([]delivery, 0, len(batch)-1)
	for _, d := range batch[1:] {
		if d.gen == first.gen && bytes.Equal(d.m.Key, first.m.Key) {
			d.gen.finish(d.m, false)
			continue
		}
		rest = append(rest, d)
	}
	return rest
}

func messages(batch []delivery) []kafka.Message {
	ms := make([]kafka.Message, len(batch))
	for i, d := range batch {
		ms[i] = d.m
	}
	return ms
}

// tryBatch handles batch in one transaction. It first tries the fast path
// (fastBatch); when that cannot settle the whole batch, it handles the batch
// again with a savepoint per message, and returns how many messages it
// settled (handled or skipped) before the first one that failed transiently
// or is to be dead-lettered; those are committed. due is that next
// message's dead letter, to publish now that the transaction has ended;
// nil when it failed transiently. When the database cannot be reached it
// settles none, and processAlone waits the outage out.
func (a *txApplier) tryBatch(ctx context.Context, batch []delivery) (n int, due *dueDeadLetter) {
	ms := messages(batch)
	if len(ms) > 1 && a.fastBatch(ctx, ms) {
		a.db.ok(ctx, "")
		return len(ms), nil
	}
	start := time.Now()
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.db.fail(ctx, "begin", err)
		}
		return 0, nil
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	var counts [numOutcomes]int
	for _, m := range ms {
		out, err := a.settle(ctx, tx, m, 1)
		if err != nil {
			// A dead letter, or a transient failure: commit what came
			// before, then dead-letter this one, or retry it alone.
			errors.As(err, &due)
			break
		}
		counts[out]++
		n++
	}
	if err := tx.Commit(ctx); err != nil {
		if pgerr.IsUnavailable(err) {
			a.db.fail(ctx, "commit", err)
		} else if ctx.Err() == nil {
			a.cfg.Logger.WarnContext(ctx, "inbox batch commit failed; retrying its messages one by one",
				slog.String("consumer", a.cfg.Name), slog.Any("error", err))
		}
		return 0, nil
	}
	a.db.ok(ctx, "")
	a.cfg.Metrics.record(a.cfg.Name, counts, n, time.Since(start))
	return n, due
}

// processAlone retries one failing message in its own transactions with
// backoff. Failures of the message (its handler, its commit) count toward
// MaxAttempts, after which it is dead-lettered; the database being
// unreachable does not count and is waited out with capped backoff. It
// returns errAbandoned when ctx ends or the message's generation is dropped.
func (a *txApplier) processAlone(ctx context.Context, d delivery) error {
	attempt, outages := 1, 0 // the batch was attempt 1
	var lastErr error
	for {
		delay := retry.Backoff(attempt, a.cfg.BackoffMin, a.cfg.BackoffMax)
		if outages > 0 {
			delay = retry.Backoff(outages, a.cfg.BackoffMin, a.cfg.BackoffMax)
		}
		if err := wait(ctx, d.gen, delay); err != nil {
			return err
		}
		if attempt >= a.cfg.MaxAttempts && lastErr != nil {
			// The last allowed attempt failed outside the handler (its
			// commit): dead-letter without running it again.
			return a.deadLetterSettled(ctx, d, &dueDeadLetter{reason: fmt.Errorf("gave up after %d attempts: %w", attempt, lastErr)})
		}
		start := time.Now()
		tx, err := a.pool.Begin(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return errAbandoned
			}
			a.db.fail(ctx, "begin", err)
			outages++
			continue
		}
		out, err := a.settle(ctx, tx, d.m, attempt+1)
		op := "handle"
		if err == nil {
			op = "commit"
			err = tx.Commit(ctx)
		}
		if err == nil {
			a.db.ok(ctx, "")
			var counts [numOutcomes]int
			counts[out]++
			a.cfg.Metrics.record(a.cfg.Name, counts, 1, time.Since(start))
			return nil
		}
		_ = tx.Rollback(context.Background())
		var due *dueDeadLetter
		switch {
		case errors.As(err, &due):
			return a.deadLetterSettled(ctx, d, due)
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			a.db.fail(ctx, op, err)
			outages++
		default:
			a.db.ok(ctx, "")
			outages = 0
			attempt++
			if op == "commit" {
				lastErr = err
				a.cfg.Metrics.failures.WithLabelValues(a.cfg.Name).Inc()
				a.cfg.Logger.WarnContext(ctx, "inbox could not commit a message's transaction; retrying",
					slog.String("consumer", a.cfg.Name), slog.String("topic", d.m.Topic), slog.Int("partition", d.m.Partition),
					slog.Int64("offset", d.m.Offset), slog.Int("attempt", attempt), slog.Any("error", err))
			} else {
				lastErr = nil // settle logged and counted the handler's failure
			}
		}
	}
}

// settle decides one message inside tx: handled, duplicate, stale, or to be
// dead-lettered (a *dueDeadLetter error, which the caller publishes after
// ending tx). Any other error is a transient failure (the savepoint is
// rolled back and the caller retries); attempt counts the tries so far, and
// the last allowed one dead-letters instead. A failure
// because the database is unreachable is never the message's: it is
// returned for the caller to wait out, whatever the attempt.
func (a *txApplier) settle(ctx context.Context, tx pgx.Tx, m kafka.Message, attempt int) (outcome, error) {
	ev, err := event.FromKafka(m)
	if err != nil {
		return deadLettered, &dueDeadLetter{reason: err}
	}
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return 0, err
	}
	out, err := a.apply(ctx, sp, m, &ev, attempt)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return 0, err
		}
		return out, nil
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil {
		return 0, rbErr
	}
	if ctx.Err() != nil || isOutage(err) {
		return 0, err
	}
	a.cfg.Metrics.failures.WithLabelValues(a.cfg.Name).Inc()
	permanent := isPermanent(err)
	if !permanent && attempt < a.cfg.MaxAttempts {
		a.cfg.Logger.WarnContext(ctx, "inbox handler failed; retrying",
			slog.String("consumer", a.cfg.Name), slog.String("event_id", ev.EventID.String()),
			slog.String("event_type", ev.EventType), slog.Int("attempt", attempt), slog.Any("error", err))
		return 0, err
	}
	if !permanent {
		err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
	}
	return deadLettered, &dueDeadLetter{ev: &ev, reason: err}
}

// apply is the inbox insert, the version guard, the upcasters and the
// handler, all in tx; the first attempt records the hop (inbox_hop_seconds).
func (a *txApplier) apply(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, attempt int) (outcome, error) {
	var reapplied bool // a requeued row: the operator sent it back
	var was []byte     // and that row as it was, for tRepark
	err := tx.QueryRow(ctx, tRecord.sql, a.cfg.Name, ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, []byte(ev.Payload)).Scan(&reapplied, &was)
	recorded := err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return 0, dbErrors.Translate("recording in inbox", err)
	}
	if !recorded {
		a.cfg.Logger.DebugContext(ctx, "inbox duplicate", slog.String("consumer", a.cfg.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType))
		if err := a.checkPayloads(ctx, tx, *ev); err != nil {
			return 0, err
		}
		return duplicate, nil
	}
	pd, err := a.parkCheck(ctx, tx, ev)
	if err != nil {
		return 0, err
	}
	if pd.release {
		a.released.add(aggregateKey{ev.AggregateType, ev.AggregateID})
	}
	switch pd.verdict {
	case parkIt, alreadyParked:
		// Not applied: no inbox row either, so that its release applies it;
		// but a requeued row (a stale dead letter's requeue, which holds
		// nothing, behind another dead message) is put back requeued, never
		// deleted: its release reapplies it as the requeue it is.
		tr, args := &tUnrecord, []any{a.cfg.Name, ev.EventID}
		if reapplied {
			tr, args = &tRepark, []any{a.cfg.Name, ev.EventID, was, nil}
		}
		if _, err := take(ctx, tx, tr, args...); err != nil {
			return 0, dbErrors.Translate("parking a message", err)
		}
		if pd.verdict == alreadyParked {
			return duplicate, nil
		}
		return parked, a.park(ctx, tx, m, ev, pd.blockedBy)
	case proceedRequeued:
		if _, err := take(ctx, tx, &tDropHold, a.cfg.Name, ev.EventID); err != nil {
			return 0, dbErrors.Translate("releasing a requeued message's aggregate", err)
		}
	}
	if !a.cfg.DisableVersionGuard {
		isStale, err := a.guardVersion(ctx, tx, ev, pd.verdict == proceedRequeued || reapplied)
		if err != nil || isStale {
			return stale, err
		}
	}
	if attempt == 1 {
		a.cfg.Metrics.observeHop(a.cfg.Name, ev.OccurredAt)
	}
	if err := a.invoke(ctx, tx, m, ev); err != nil {
		return 0, err
	}
	return processed, nil
}
