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
	"github.com/onceflow/onceflow/pkg/internal/pgerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/internal/tracectx"
)

// Handler applies one event's side effects using tx, the transaction the
// inbox row is written in. It must not commit or roll back tx. An error
// wrapping ErrPermanent or event.ErrInvalid dead-letters the event at once;
// any other error is retried.
type Handler func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// processBatch handles batch in as few transactions as it can: one, unless
// a message fails transiently or is to be dead-lettered; then what came
// before it commits, it is retried alone with backoff or dead-lettered with
// no transaction open (dueDeadLetter), and the rest continues in a new
// transaction.
// Every message of batch is finished (done or abandoned) when it returns.
func (c *Consumer) processBatch(ctx context.Context, batch []delivery) (err error) {
	defer func() {
		for _, d := range batch {
			d.gen.finish(d.m, false)
		}
	}()
	for len(batch) > 0 {
		n, due := c.tryBatch(ctx, batch)
		if err := c.committed(ctx, batch[:n]); err != nil {
			batch = batch[n:]
			return err
		}
		batch = batch[n:]
		if len(batch) == 0 {
			return nil
		}
		var aloneErr error
		if due != nil {
			aloneErr = c.deadLetterSettled(ctx, batch[0], due)
		} else {
			aloneErr = c.processAlone(ctx, batch[0])
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
		err := c.committed(ctx, batch[:1])
		batch = batch[1:]
		if err != nil {
			return err
		}
	}
	return nil
}

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
func (c *Consumer) tryBatch(ctx context.Context, batch []delivery) (n int, due *dueDeadLetter) {
	ms := messages(batch)
	if len(ms) > 1 && c.fastBatch(ctx, ms) {
		c.db.ok(ctx, "")
		return len(ms), nil
	}
	start := time.Now()
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.db.fail(ctx, "begin", err)
		}
		return 0, nil
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	var counts [numOutcomes]int
	for _, m := range ms {
		out, err := c.settle(ctx, tx, m, 1)
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
			c.db.fail(ctx, "commit", err)
		} else if ctx.Err() == nil {
			c.cfg.Logger.WarnContext(ctx, "inbox batch commit failed; retrying its messages one by one",
				slog.String("consumer", c.cfg.Name), slog.Any("error", err))
		}
		return 0, nil
	}
	c.db.ok(ctx, "")
	c.cfg.Metrics.record(c.cfg.Name, counts, n, time.Since(start))
	return n, due
}

// processAlone retries one failing message in its own transactions with
// backoff. Failures of the message (its handler, its commit) count toward
// MaxAttempts, after which it is dead-lettered; the database being
// unreachable does not count and is waited out with capped backoff. It
// returns errAbandoned when ctx ends or the message's generation is dropped.
func (c *Consumer) processAlone(ctx context.Context, d delivery) error {
	attempt, outages := 1, 0 // the batch was attempt 1
	var lastErr error
	for {
		delay := retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)
		if outages > 0 {
			delay = retry.Backoff(outages, c.cfg.BackoffMin, c.cfg.BackoffMax)
		}
		if err := wait(ctx, d.gen, delay); err != nil {
			return err
		}
		if attempt >= c.cfg.MaxAttempts && lastErr != nil {
			// The last allowed attempt failed outside the handler (its
			// commit): dead-letter without running it again.
			return c.deadLetterSettled(ctx, d, &dueDeadLetter{reason: fmt.Errorf("gave up after %d attempts: %w", attempt, lastErr)})
		}
		start := time.Now()
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return errAbandoned
			}
			c.db.fail(ctx, "begin", err)
			outages++
			continue
		}
		out, err := c.settle(ctx, tx, d.m, attempt+1)
		op := "handle"
		if err == nil {
			op = "commit"
			err = tx.Commit(ctx)
		}
		if err == nil {
			c.db.ok(ctx, "")
			var counts [numOutcomes]int
			counts[out]++
			c.cfg.Metrics.record(c.cfg.Name, counts, 1, time.Since(start))
			return nil
		}
		_ = tx.Rollback(context.Background())
		var due *dueDeadLetter
		switch {
		case errors.As(err, &due):
			return c.deadLetterSettled(ctx, d, due)
		case ctx.Err() != nil:
			return errAbandoned
		case isOutage(err):
			c.db.fail(ctx, op, err)
			outages++
		default:
			c.db.ok(ctx, "")
			outages = 0
			attempt++
			if op == "commit" {
				lastErr = err
				c.cfg.Metrics.failures.WithLabelValues(c.cfg.Name).Inc()
				c.cfg.Logger.WarnContext(ctx, "inbox could not commit a message's transaction; retrying",
					slog.String("consumer", c.cfg.Name), slog.String("topic", d.m.Topic), slog.Int("partition", d.m.Partition),
					slog.Int64("offset", d.m.Offset), slog.Int("attempt", attempt), slog.Any("error", err))
			} else {
				lastErr = nil // settle logged and counted the handler's failure
			}
		}
	}
}

const insertProcessed = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', sha256($9), now())
ON CONFLICT (consumer, message_id) DO NOTHING`

// settle decides one message inside tx: handled, duplicate, stale, or to be
// dead-lettered (a *dueDeadLetter error, which the caller publishes after
// ending tx). Any other error is a transient failure (the savepoint is
// rolled back and the caller retries); attempt counts the tries so far, and
// the last allowed one dead-letters instead. A failure
// because the database is unreachable is never the message's: it is
// returned for the caller to wait out, whatever the attempt.
func (c *Consumer) settle(ctx context.Context, tx pgx.Tx, m kafka.Message, attempt int) (outcome, error) {
	ev, err := event.FromKafka(m)
	if err != nil {
		return deadLettered, &dueDeadLetter{reason: err}
	}
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return 0, err
	}
	out, err := c.apply(ctx, sp, m, &ev, attempt)
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
	c.cfg.Metrics.failures.WithLabelValues(c.cfg.Name).Inc()
	permanent := isPermanent(err)
	if !permanent && attempt < c.cfg.MaxAttempts {
		c.cfg.Logger.WarnContext(ctx, "inbox handler failed; retrying",
			slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()),
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
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope, attempt int) (outcome, error) {
	tag, err := tx.Exec(ctx, insertProcessed, c.cfg.Name, ev.EventID, ev.EventType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, []byte(ev.Payload))
	if err != nil {
		return 0, dbErrors.Translate("recording in inbox", err)
	}
	if tag.RowsAffected() == 0 {
		c.cfg.Logger.DebugContext(ctx, "inbox duplicate", slog.String("consumer", c.cfg.Name),
			slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType))
		if err := c.checkPayloads(ctx, tx, *ev); err != nil {
			return 0, err
		}
		return duplicate, nil
	}
	pd, err := c.parkCheck(ctx, tx, ev)
	if err != nil {
		return 0, err
	}
	if pd.release {
		c.released.add(aggregateKey{ev.AggregateType, ev.AggregateID})
	}
	switch pd.verdict {
	case parkIt, alreadyParked:
		// Not applied: no inbox row either, so that its release applies it.
		if _, err := tx.Exec(ctx, deleteInboxRow, c.cfg.Name, ev.EventID); err != nil {
			return 0, dbErrors.Translate("parking a message", err)
		}
		if pd.verdict == alreadyParked {
			return duplicate, nil
		}
		return parked, c.park(ctx, tx, m, ev, pd.blockedBy)
	case proceedRequeued:
		if _, err := tx.Exec(ctx, dropDeadKey, c.cfg.Name, ev.EventID); err != nil {
			return 0, dbErrors.Translate("releasing a requeued message's aggregate", err)
		}
	}
	if !c.cfg.DisableVersionGuard {
		isStale, err := c.guardVersion(ctx, tx, ev, pd.verdict == proceedRequeued)
		if err != nil || isStale {
			return stale, err
		}
	}
	if attempt == 1 {
		c.cfg.Metrics.observeHop(c.cfg.Name, ev.OccurredAt)
	}
	if err := c.invoke(ctx, tx, m, ev); err != nil {
		return 0, err
	}
	return processed, nil
}

// invoke upcasts ev and runs the handler in tx, in m's consumer span.
func (c *Consumer) invoke(ctx context.Context, tx pgx.Tx, m kafka.Message, ev *event.Envelope) error {
	if err := c.upcast(ev); err != nil {
		return err
	}
	return c.handleTraced(ctx, tx, m, *ev)
}

// handleTraced runs the handler inside the message's consumer span.
func (c *Consumer) handleTraced(ctx context.Context, tx pgx.Tx, m kafka.Message, ev event.Envelope) error {
	ctx, span := c.startProcess(ctx, m, ev)
	err := c.handle(ctx, tx, ev)
	tracectx.End(span, err)
	return err
}
