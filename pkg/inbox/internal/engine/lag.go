package engine

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// reportLag refreshes consumer_lag_messages every LagInterval: per partition,
// the end offset minus the group's committed offset. It reports every
// partition of the topic, owned by this member or not, so any instance's
// series shows the group's whole backlog.
func (c *Consumer) reportLag(ctx context.Context) {
	d := c.group.Dialer
	client := &kafka.Client{Addr: kafka.TCP(c.group.Brokers...), Timeout: 5 * time.Second,
		Transport: &kafka.Transport{DialTimeout: d.Timeout, TLS: d.TLS, SASL: d.SASLMechanism}}
	tick := time.NewTicker(c.cfg.LagInterval)
	defer tick.Stop()
	for {
		if err := c.measureLag(ctx, client); err != nil && ctx.Err() == nil {
			c.cfg.Logger.DebugContext(ctx, "inbox could not measure consumer lag", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (c *Consumer) measureLag(ctx context.Context, client *kafka.Client) error {
	rc := struct{ Topic, GroupID string }{c.group.Topic, c.group.Group}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{rc.Topic}})
	if err != nil {
		return err
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return nil
	}
	var ends []kafka.OffsetRequest
	var ids []int
	for _, p := range meta.Topics[0].Partitions {
		ends = append(ends, kafka.LastOffsetOf(p.ID))
		ids = append(ids, p.ID)
	}
	listed, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{rc.Topic: ends}})
	if err != nil {
		return err
	}
	committed, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: rc.GroupID, Topics: map[string][]int{rc.Topic: ids}})
	if err != nil {
		return err
	}
	done := map[int]int64{}
	for _, p := range committed.Topics[rc.Topic] {
		done[p.Partition] = p.CommittedOffset
	}
	for _, p := range listed.Topics[rc.Topic] {
		lag := p.LastOffset
		if off := done[p.Partition]; off > 0 {
			lag -= off
		}
		c.cfg.Metrics.lag.WithLabelValues(c.cfg.Name, rc.Topic, strconv.Itoa(p.Partition)).Set(float64(lag))
	}
	return nil
}

// reportDeadLetters refreshes inbox_dead_letters, inbox_parked_messages and
// the holds' gauges (reportHolds) every LagInterval: the consumer's
// dead_lettered rows, which a requeue marks requeued, so the gauge is what
// is still waiting for an operator. Undecodable messages have no row
// and are only in the dead-letter topic and inbox_dead_lettered_total.
func (c *Consumer) reportDeadLetters(ctx context.Context) {
	tick := time.NewTicker(c.cfg.LagInterval)
	defer tick.Stop()
	for {
		var n int64
		err := c.shared.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox_messages WHERE consumer = $1 AND status = 'dead_lettered'`,
			c.cfg.Name).Scan(&n)
		var p int64
		if err == nil {
			// Parked events wait for a dead letter's requeue: the same
			// operator backlog, seen from the other side.
			err = c.shared.Pool.QueryRow(ctx, countParked, c.cfg.Name).Scan(&p)
		}
		if err == nil {
			err = c.reportHolds(ctx)
		}
		if err == nil {
			c.shared.DB.OK(ctx, "") // the idle consumer's sign that an outage ended
			c.cfg.Metrics.deadLetters.WithLabelValues(c.cfg.Name).Set(float64(n))
			c.cfg.Metrics.parkedNow.WithLabelValues(c.cfg.Name).Set(float64(p))
		} else if ctx.Err() == nil && IsOutage(err) {
			c.shared.DB.Fail(ctx, "count_dead_letters", err)
		} else if ctx.Err() == nil {
			c.cfg.Logger.DebugContext(ctx, "inbox could not count its dead letters", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// holdsState counts the consumer's holds that no requeueable dead letter
// backs (the dead event's row is neither dead_lettered nor requeued in the
// last 5 minutes), the age of the oldest hold, and the dead holds older
// than the dead-letter topic's retention ($2) whose letter is only in the
// topic (no original kept in inbox_dead_letter_originals): the row still
// says dead_lettered, so the first count misses them, but the letter has
// most likely been deleted by the topic's retention.
const holdsState = `
SELECT count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM inbox_messages i WHERE i.consumer = d.consumer AND i.message_id = d.message_id
             AND (i.status = 'dead_lettered' OR (i.status = 'requeued' AND d.requeued_at > now() - interval '5 minutes')))),
       coalesce(extract(epoch FROM now() - min(d.dead_at)), 0)::float8,
       count(*) FILTER (WHERE d.status = 'dead' AND d.dead_at < now() - $2::bigint * interval '1 microsecond'
           AND NOT EXISTS (SELECT 1 FROM inbox_dead_letter_originals o
                           WHERE o.consumer = d.consumer AND o.message_id = d.message_id)
           AND EXISTS (SELECT 1 FROM inbox_messages i WHERE i.consumer = d.consumer AND i.message_id = d.message_id
                       AND i.status = 'dead_lettered'))
FROM inbox_dead_keys d WHERE d.consumer = $1`

const operatorActionCounts = `SELECT action, count(*) FROM inbox_operator_actions WHERE consumer = $1 GROUP BY action`

// reportHolds refreshes inbox_stranded_holds, inbox_oldest_hold_age_seconds,
// inbox_holds_past_dead_letter_retention and inbox_operator_actions.
func (c *Consumer) reportHolds(ctx context.Context) error {
	var stranded, pastRetention int64
	var oldest float64
	if err := c.shared.Pool.QueryRow(ctx, holdsState, c.cfg.Name, c.cfg.DeadLetterRetention.Microseconds()).
		Scan(&stranded, &oldest, &pastRetention); err != nil {
		return err
	}
	rows, err := c.shared.Pool.Query(ctx, operatorActionCounts, c.cfg.Name)
	if err != nil {
		return err
	}
	var (
		action string
		n      int64
	)
	counts := map[string]int64{}
	if _, err := pgx.ForEachRow(rows, []any{&action, &n}, func() error { counts[action] = n; return nil }); err != nil {
		return err
	}
	m := c.cfg.Metrics
	m.strandedHolds.WithLabelValues(c.cfg.Name).Set(float64(stranded))
	m.oldestHold.WithLabelValues(c.cfg.Name).Set(oldest)
	m.pastRetention.WithLabelValues(c.cfg.Name).Set(float64(pastRetention))
	for a, n := range counts {
		m.operatorActions.WithLabelValues(c.cfg.Name, a).Set(float64(n))
	}
	return nil
}
