package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

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

// TxApplier is the transactional applier, NewConsumer's: each message's
// inbox row, version guard and handler commit in one transaction, a batch
// of messages in as few transactions as it can (process), the fast path
// first (txapply_fast.go); both paths run the handler the same way
// (txapply_handle.go).
type TxApplier struct {
	*Shared
	handle Handler
	// handleBatch applies a batch's new events at once on the fast path
	// (NewBatchConsumer); nil: handle, one by one.
	handleBatch func(ctx context.Context, tx pgx.Tx, evs []Applying) error
}

// Process handles batch in as few transactions as it can: one, unless
// a message fails transiently or is to be dead-lettered; then what came
// before it commits, it is retried alone with backoff or dead-lettered with
// no transaction open (dueDeadLetter), and the rest continues in a new
// transaction.
// Every message of batch is finished (done or abandoned) when it returns.
func (a *TxApplier) Process(ctx context.Context, batch []Delivery) (err error) {
	defer func() {
		for _, d := range batch {
			d.Gen.Finish(d.Msg, false)
		}
	}()
	for len(batch) > 0 {
		n, due := a.tryBatch(ctx, batch)
		if err := a.Committed(ctx, batch[:n]); err != nil {
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
		err := a.Committed(ctx, batch[:1])
		batch = batch[1:]
		if err != nil {
			return err
		}
	}
	return nil
}

// Health is nil: the transactional applier calls nothing but the database,
// whose outages the dispatcher reports.
func (a *TxApplier) Health() error { return nil }

// abandonKey finishes batch[0] unfinished, with every later message of its
// key and generation, and returns the rest of the batch in order.
func abandonKey(batch []Delivery) []Delivery {
	first := batch[0]
	first.Gen.Finish(first.Msg, false)
	rest := make([]Delivery, 0, len(batch)-1)
	for _, d := range batch[1:] {
		if d.Gen == first.Gen && bytes.Equal(d.Msg.Key, first.Msg.Key) {
			d.Gen.Finish(d.Msg, false)
			continue
		}
		rest = append(rest, d)
	}
	return rest
}

func messages(batch []Delivery) []kafka.Message {
	ms := make([]kafka.Message, len(batch))
	for i, d := range batch {
		ms[i] = d.Msg
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
func (a *TxApplier) tryBatch(ctx context.Context, batch []Delivery) (n int, due *DueDeadLetter) {
	ms := messages(batch)
	if len(ms) > 1 && a.fastBatch(ctx, ms) {
		a.DB.OK(ctx, "")
		return len(ms), nil
	}
	start := time.Now()
	tx, err := a.Pool.Begin(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.DB.Fail(ctx, "begin", err)
		}
		return 0, nil
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	var counts [NumOutcomes]int
	for _, m := range ms {
		out, err := a.Settle(ctx, tx, m, 1)
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
			a.DB.Fail(ctx, "commit", err)
		} else if ctx.Err() == nil {
			a.Config.Logger.WarnContext(ctx, "inbox batch commit failed; retrying its messages one by one",
				slog.String("consumer", a.Config.Name), slog.Any("error", err))
		}
		return 0, nil
	}
	a.DB.OK(ctx, "")
	a.Config.Metrics.record(a.Config.Name, counts, n, time.Since(start))
	return n, due
}

// processAlone retries one failing message in its own transactions with
// backoff. Failures of the message (its handler, its commit) count toward
// MaxAttempts, after which it is dead-lettered; the database being
// unreachable does not count and is waited out with capped backoff. It
// returns errAbandoned when ctx ends or the message's generation is dropped.
func (a *TxApplier) processAlone(ctx context.Context, d Delivery) error {
	attempt, outages := 1, 0 // the batch was attempt 1
	var lastErr error
	for {
		delay := retry.Backoff(attempt, a.Config.BackoffMin, a.Config.BackoffMax)
		if outages > 0 {
			delay = retry.Backoff(outages, a.Config.BackoffMin, a.Config.BackoffMax)
		}
		if err := Wait(ctx, d.Gen, delay); err != nil {
			return err
		}
		if attempt >= a.Config.MaxAttempts && lastErr != nil {
			// The last allowed attempt failed outside the handler (its
			// commit): dead-letter without running it again.
			return a.deadLetterSettled(ctx, d, &DueDeadLetter{Reason: fmt.Errorf("gave up after %d attempts: %w", attempt, lastErr)})
		}
		start := time.Now()
		tx, err := a.Pool.Begin(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ErrAbandoned
			}
			a.DB.Fail(ctx, "begin", err)
			outages++
			continue
		}
		out, err := a.Settle(ctx, tx, d.Msg, attempt+1)
		op := "handle"
		if err == nil {
			op = "commit"
			err = tx.Commit(ctx)
		}
		if err == nil {
			a.DB.OK(ctx, "")
			var counts [NumOutcomes]int
			counts[out]++
			a.Config.Metrics.record(a.Config.Name, counts, 1, time.Since(start))
			return nil
		}
		_ = tx.Rollback(context.Background())
		var due *DueDeadLetter
		switch {
		case errors.As(err, &due):
			return a.deadLetterSettled(ctx, d, due)
		case ctx.Err() != nil:
			return ErrAbandoned
		case IsOutage(err):
			a.DB.Fail(ctx, op, err)
			outages++
		default:
			a.DB.OK(ctx, "")
			outages = 0
			attempt++
			if op == "commit" {
				lastErr = err
				a.Config.Metrics.failures.WithLabelValues(a.Config.Name).Inc()
				a.Config.Logger.WarnContext(ctx, "inbox could not commit a message's transaction; retrying",
					slog.String("consumer", a.Config.Name), slog.String("topic", d.Msg.Topic), slog.Int("partition", d.Msg.Partition),
					slog.Int64("offset", d.Msg.Offset), slog.Int("attempt", attempt), slog.Any("error", err))
			} else {
				lastErr = nil // settle logged and counted the handler's failure
			}
		}
	}
}

// Settle decides one message inside tx: handled, duplicate, stale, or to be
// dead-lettered (a *dueDeadLetter error, which the caller publishes after
// ending tx). Any other error is a transient failure (the savepoint is
// rolled back and the caller retries); attempt counts the tries so far, and
// the last allowed one dead-letters instead. A failure
// because the database is unreachable is never the message's: it is
// returned for the caller to wait out, whatever the attempt.
func (a *TxApplier) Settle(ctx context.Context, tx pgx.Tx, m kafka.Message, attempt int) (Outcome, error) {
	ev, err := event.FromKafka(m)
	if err != nil {
		return DeadLettered, &DueDeadLetter{Reason: err}
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
	if ctx.Err() != nil || IsOutage(err) {
		return 0, err
	}
	a.Config.Metrics.failures.WithLabelValues(a.Config.Name).Inc()
	permanent := IsPermanent(err)
	if !permanent && attempt < a.Config.MaxAttempts {
		a.Config.Logger.WarnContext(ctx, "inbox handler failed; retrying",
			slog.String("consumer", a.Config.Name), slog.String("event_id", ev.EventID.String()),
			slog.String("event_type", ev.EventType), slog.Int("attempt", attempt), slog.Any("error", err))
		return 0, err
	}
	if !permanent {
		err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
	}
	return DeadLettered, &DueDeadLetter{Ev: &ev, Reason: err}
}

// apply is the inbox insert, the version guard, the upcasters and the
// handler, all in tx; the first attempt records the hop (inbox_hop_seconds).
func (a *TxApplier) apply(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, attempt int) (Outcome, error) {
	var reapplied bool // a requeued row: the operator sent it back
	var was []byte     // and that row as it was, for state.Repark
	err := tx.QueryRow(ctx, state.Record.SQL, a.Config.Name, ev.EventID, ev.EventType, ev.AggregateType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, []byte(ev.Payload)).Scan(&reapplied, &was)
	recorded := err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return 0, DBErrors.Translate("recording in inbox", err)
	}
	if !recorded {
		a.Config.Logger.DebugContext(ctx, "inbox duplicate", slog.String("consumer", a.Config.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType))
		if err := a.CheckPayloads(ctx, tx, *ev); err != nil {
			return 0, err
		}
		return Duplicate, nil
	}
	pd, err := a.ParkCheck(ctx, tx, ev)
	if err != nil {
		return 0, err
	}
	if pd.Release {
		a.Released.Add(AggregateKey{ev.AggregateType, ev.AggregateID})
	}
	switch pd.Verdict {
	case ParkIt, AlreadyParked:
		// Not applied: no inbox row either, so that its release applies it;
		// but a requeued row (a stale dead letter's requeue, which holds
		// nothing, behind another dead message) is put back requeued, never
		// deleted: its release reapplies it as the requeue it is.
		tr, args := &state.Unrecord, []any{a.Config.Name, ev.EventID}
		if reapplied {
			tr, args = &state.Repark, []any{a.Config.Name, ev.EventID, was, nil}
		}
		if _, err := state.Take(ctx, tx, tr, args...); err != nil {
			return 0, DBErrors.Translate("parking a message", err)
		}
		if pd.Verdict == AlreadyParked {
			return Duplicate, nil
		}
		return ParkedOutcome, a.Park(ctx, tx, m, ev, pd.BlockedBy)
	case ProceedRequeued:
		if _, err := state.Take(ctx, tx, &state.DropHold, a.Config.Name, ev.EventID); err != nil {
			return 0, DBErrors.Translate("releasing a requeued message's aggregate", err)
		}
	}
	if !a.Config.DisableVersionGuard {
		isStale, err := a.GuardVersion(ctx, tx, ev, pd.Verdict == ProceedRequeued || reapplied)
		if err != nil || isStale {
			return Stale, err
		}
	}
	if attempt == 1 {
		a.Config.Metrics.observeHop(a.Config.Name, ev.OccurredAt)
	}
	if err := a.invoke(ctx, tx, m, ev); err != nil {
		return 0, err
	}
	return Processed, nil
}
