package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/pgerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

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

// fastBatch settles a whole batch in one transaction with set-based inbox
// work: one INSERT for every message's inbox row, one locked read and one
// upsert for the version guard, then the handlers one after another without
// savepoints. It is all or nothing: if any message is undecodable, needs an
// upcaster that fails, finds a version gap under GapRetry, or its handler
// fails, the transaction is rolled back and fastBatch returns false, and the
// caller takes the savepoint path, which settles each message on its own
// (retry, dead letter). Handlers run in a transaction that may roll back, as
// they always may.
func (c *Consumer) fastBatch(ctx context.Context, batch []kafka.Message) bool {
	start := time.Now()
	evs := make([]event.Envelope, len(batch))
	for i, m := range batch {
		ev, err := event.FromKafka(m)
		if err != nil {
			return false
		}
		evs[i] = ev
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit

	// A held aggregate (a dead message, parked messages) is decided message
	// by message, on the savepoint path.
	if held, err := c.heldKeys(ctx, tx, evs); err != nil || len(held) > 0 {
		return false
	}
	fresh, err := c.insertBatch(ctx, tx, batch, evs)
	if err != nil {
		c.fastPathFailed(ctx, "recording in inbox", err)
		return false
	}
	outs := make([]outcome, len(batch))
	seen := make(map[uuid.UUID]bool, len(batch))
	var dups []event.Envelope
	for i, ev := range evs {
		if !fresh[ev.EventID] || seen[ev.EventID] {
			outs[i] = duplicate
			dups = append(dups, ev)
		}
		seen[ev.EventID] = true
	}
	if err := c.checkPayloads(ctx, tx, dups...); err != nil {
		c.fastPathFailed(ctx, "comparing duplicates' payloads", err)
		return false
	}
	var notes []func()
	if !c.cfg.DisableVersionGuard {
		if notes, err = c.guardBatch(ctx, tx, evs, outs); err != nil {
			c.fastPathFailed(ctx, "checking aggregate versions", err)
			return false
		}
	}
	var counts [numOutcomes]int
	for i := range evs {
		counts[outs[i]]++
		if outs[i] != processed {
			continue
		}
		c.cfg.Metrics.observeHop(c.cfg.Name, evs[i].OccurredAt)
		if err := c.invoke(ctx, tx, batch[i], &evs[i]); err != nil {
			c.fastPathFailed(ctx, "handling "+evs[i].EventID.String(), err)
			return false
		}
	}
	if err := tx.Commit(ctx); err != nil {
		c.fastPathFailed(ctx, "committing", err)
		return false
	}
	for _, note := range notes {
		note()
	}
	if counts[duplicate] > 0 {
		c.cfg.Logger.DebugContext(ctx, "inbox duplicates", slog.String("consumer", c.cfg.Name), slog.Int("count", counts[duplicate]))
	}
	c.cfg.Metrics.record(c.cfg.Name, counts, len(batch), time.Since(start))
	return true
}

func (c *Consumer) fastPathFailed(ctx context.Context, step string, err error) {
	c.cfg.Logger.DebugContext(ctx, "inbox batch falls back to one savepoint per message",
		slog.String("consumer", c.cfg.Name), slog.String("step", step), slog.Any("error", err))
}

const insertProcessedBatch = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
SELECT $1, m.id, m.event_type, m.aggregate_id, m.aggregate_version, m.topic, m.kafka_partition,
       m.kafka_offset, 'processed', sha256(m.payload), now()
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[], $8::bigint[], $9::bytea[])
     AS m(id, event_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset, payload)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id`

// insertBatch records every message in the inbox in one statement and
// returns the ids that were new (a redelivered id finds its row and is not
// returned; within the batch, the first occurrence is the one inserted).
func (c *Consumer) insertBatch(ctx context.Context, tx pgx.Tx, batch []kafka.Message, evs []event.Envelope) (map[uuid.UUID]bool, error) {
	n := len(batch)
	// [16]byte, not uuid.UUID: pgx encodes and decodes it natively instead of
	// through driver.Valuer, sql.Scanner and text.
	ids, types, aggs, versions := make([][16]byte, n), make([]string, n), make([]string, n), make([]int64, n)
	topics, partitions, offsets, payloads := make([]string, n), make([]int32, n), make([]int64, n), make([][]byte, n)
	for i, m := range batch {
		ev := evs[i]
		ids[i], types[i], aggs[i], versions[i] = ev.EventID, ev.EventType, ev.AggregateID, ev.AggregateVersion
		topics[i], partitions[i], offsets[i], payloads[i] = m.Topic, int32(m.Partition), m.Offset, []byte(ev.Payload)
	}
	rows, err := tx.Query(ctx, insertProcessedBatch, c.cfg.Name, ids, types, aggs, versions, topics, partitions, offsets, payloads)
	if err != nil {
		return nil, err
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, err
	}
	fresh := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		fresh[uuid.UUID(id)] = true
	}
	return fresh, nil
}

const deleteInboxRow = `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2`

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
