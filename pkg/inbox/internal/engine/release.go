package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/onceflow/onceflow/pkg/inbox/internal/dlt"
	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
)

// releaseParked runs, after batch is settled, the parked messages of the
// batch's aggregates that may go now, one at a time in the order they were
// parked, through the applier, under the generation of the
// aggregate's last message in the batch. A released message that is
// settled (applied, stale, dead-lettered, uncertain) leaves the parking; one
// that is not (its generation was dropped, the shutdown grace ended) stays
// parked first, and the aggregate's next message releases it.
func (c *Consumer) releaseParked(ctx context.Context, batch []fetched) error {
	if c.shared.Released.empty() {
		// Nothing to release (a requeued dead message is rare): no need to
		// decode every envelope of the batch a second time to find its key.
		return nil
	}
	type target struct {
		k   AggregateKey
		gen *generation
	}
	var targets []target
	idx := map[AggregateKey]int{}
	for _, d := range batch {
		ev, err := event.FromKafka(d.m)
		if err != nil {
			continue
		}
		k := AggregateKey{ev.AggregateType, ev.AggregateID}
		if i, ok := idx[k]; ok {
			targets[i].gen = d.gen
			continue
		}
		idx[k] = len(targets)
		targets = append(targets, target{k, d.gen})
	}
	for _, tg := range targets {
		if !c.shared.Released.take(tg.k) {
			continue
		}
		for ctx.Err() == nil && (tg.gen == nil || !tg.gen.IsDropped()) {
			m, settled, ok, err := c.nextParked(ctx, tg.k)
			if err != nil {
				if IsOutage(err) {
					c.shared.DB.Fail(ctx, "release_parked", err)
				}
				c.cfg.Logger.WarnContext(ctx, "inbox could not read its parked messages; the aggregate's next message releases them",
					slog.String("consumer", c.cfg.Name), slog.String("aggregate_id", tg.k.ID), slog.Any("error", err))
				break
			}
			if !ok {
				break
			}
			if !settled {
				if err := c.applier.Process(ctx, deliveries([]fetched{{m: m, gen: tg.gen.released()}})); err != nil {
					return err
				}
				if settled, err = c.inboxSettled(ctx, m); err != nil || !settled {
					break // abandoned: it stays first in the parking
				}
			}
			if _, err := state.Take(ctx, c.shared.Pool, &state.Unpark, c.cfg.Name, parkedID(m)); err != nil {
				break
			}
			c.cfg.Metrics.released.WithLabelValues(c.cfg.Name).Inc()
		}
	}
	return nil
}

// nextParked reads the first parked message of k, as it was fetched;
// settled when the inbox already settled it (released before a crash).
func (c *Consumer) nextParked(ctx context.Context, k AggregateKey) (m kafka.Message, settled, ok bool, err error) {
	var (
		id      uuid.UUID
		headers []byte
	)
	err = c.shared.Pool.QueryRow(ctx, nextParked, c.cfg.Name, k.Type, k.ID).
		Scan(&id, &m.Topic, &m.Partition, &m.Offset, &m.Key, &m.Value, &headers, &settled)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, false, false, nil
	}
	if err != nil {
		return m, false, false, DBErrors.Translate("reading a parked message", err)
	}
	if m.Headers, err = dlt.DecodeHeaders(headers); err != nil {
		return m, false, false, fmt.Errorf("parked message %s: its headers: %w", id, err)
	}
	return m, settled, true, nil
}

// inboxSettled reports whether the inbox settled m for good.
func (c *Consumer) inboxSettled(ctx context.Context, m kafka.Message) (bool, error) {
	var settled bool
	err := c.shared.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM inbox_messages WHERE consumer = $1 AND message_id = $2
		AND status IN ('processed', 'stale', 'dead_lettered', 'uncertain', 'skipped'))`, c.cfg.Name, parkedID(m)).Scan(&settled)
	return settled, err
}

// parkedID is the event id of a message read back from the parking, whose
// envelope decoded when it was parked.
func parkedID(m kafka.Message) uuid.UUID {
	ev, _ := event.FromKafka(m)
	return ev.EventID
}

// firstParkedOfFreeKeys is, per aggregate parked in the given partitions of
// topic with no dead message ahead, its first parked message.
const firstParkedOfFreeKeys = `
SELECT DISTINCT ON (p.aggregate_type, p.aggregate_id)
       p.message_id, p.topic, p.kafka_partition, p.kafka_offset, p.msg_key, p.msg_value, p.msg_headers,
       EXISTS (SELECT 1 FROM inbox_messages i WHERE i.consumer = p.consumer AND i.message_id = p.message_id
               AND i.status IN ('processed', 'stale', 'dead_lettered', 'uncertain', 'skipped'))
FROM inbox_parked_messages p
WHERE p.consumer = $1 AND p.topic = $2 AND p.kafka_partition = ANY($3)
  AND NOT EXISTS (SELECT 1 FROM inbox_dead_keys d
                  WHERE d.consumer = p.consumer AND d.aggregate_type = p.aggregate_type AND d.aggregate_id = p.aggregate_id)
ORDER BY p.aggregate_type, p.aggregate_id, p.seq`

// resumeReleases hands the workers, when a generation starts and every
// LagInterval after, the first parked message of every aggregate of its
// partitions that nothing dead holds any more: a consumer that stopped
// after applying a requeued message, before releasing what was parked
// behind it, left them so, and an operator's ReleaseHeld leaves them so.
// One the inbox settled already leaves the parking at once. Each
// is handled as a released message (its key's worker applies it, then
// releases the rest); a failure to read them is logged, and the next
// generation, or the aggregate's next message, tries again.
func (c *Consumer) resumeReleases(ctx context.Context, g *generation, assigned map[partitionKey]int64,
	dispatch func(context.Context, fetched) bool) {
	var parts []int32
	for k := range assigned {
		if k.topic == c.group.Topic {
			parts = append(parts, int32(k.partition))
		}
	}
	if len(parts) == 0 {
		return
	}
	rows, err := c.shared.Pool.Query(ctx, firstParkedOfFreeKeys, c.cfg.Name, c.group.Topic, parts)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.WarnContext(ctx, "inbox could not look for parked messages to release",
				slog.String("consumer", c.cfg.Name), slog.Any("error", err))
		}
		return
	}
	var (
		ms   []kafka.Message
		done []uuid.UUID
	)
	for rows.Next() {
		var (
			m       kafka.Message
			id      uuid.UUID
			headers []byte
			settled bool
		)
		if err := rows.Scan(&id, &m.Topic, &m.Partition, &m.Offset, &m.Key, &m.Value, &headers, &settled); err != nil {
			break
		}
		if settled {
			// Released and settled before a crash: it only leaves the
			// parking (the next look dispatches the one after it).
			done = append(done, id)
			continue
		}
		if m.Headers, err = dlt.DecodeHeaders(headers); err != nil {
			continue
		}
		ms = append(ms, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil && ctx.Err() == nil {
		c.cfg.Logger.WarnContext(ctx, "inbox could not look for parked messages to release",
			slog.String("consumer", c.cfg.Name), slog.Any("error", err))
	}
	for _, id := range done {
		if _, err := state.Take(ctx, c.shared.Pool, &state.Unpark, c.cfg.Name, id); err == nil {
			c.cfg.Metrics.released.WithLabelValues(c.cfg.Name).Inc()
		}
	}
	for _, m := range ms {
		if !dispatch(ctx, fetched{m: m, gen: g.released()}) {
			return
		}
	}
}
