package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
)

// lane publishes the events of one topic, in the order they were decoded,
// as the polling relay writes each topic on its own: a topic whose writes
// fail (deleted, its leader away, refused by an ACL) holds back its own
// events only, while the stream goes on for the others until this lane's
// queue (CDCConfig.MaxInFlight events) is full. The slot stays confirmed
// before its first unacknowledged event, so nothing is lost either way.
type lane struct {
	r     *CDCRelay
	topic string
	in    chan cdcEvent
	acked chan<- laneAck
	kafka *outage

	// deadAhead holds, per aggregate (type and id), the event id of its
	// first dead outbox row: in table mode a dead event holds back its
	// aggregate's later events, as in the polling relay, so they are
	// marked dead behind it instead of published ahead of it. Its requeued
	// copy (the same event id, a new row) lifts the hold; the next dead row
	// of the aggregate, if any, takes its place. Loaded from the table when
	// the lane starts (nil until then), so a restart keeps the holds.
	deadAhead map[string]string
	reload    bool // read deadAhead again before the next batch
}

func (r *CDCRelay) newLane(topic string, acked chan<- laneAck) *lane {
	return &lane{r: r, topic: topic, in: make(chan cdcEvent, r.cfg.MaxInFlight), acked: acked,
		kafka: newOutage("publishing to Kafka topic "+topic, r.cfg.Logger, r.cfg.LogInterval)}
}

// run publishes until ctx ends. A batch is whatever the queue holds, up to
// BatchSize, after waiting FlushDelay for more to join a short one.
func (l *lane) run(ctx context.Context) {
	defer l.r.topicUp(l.topic) // a lane that stops is no longer down
	batch := make([]cdcEvent, 0, l.r.cfg.BatchSize)
	for {
		batch = batch[:0]
		select {
		case ev := <-l.in:
			batch = append(batch, ev)
		case <-ctx.Done():
			return
		}
		flush := time.NewTimer(l.r.cfg.FlushDelay)
	fill:
		for len(batch) < l.r.cfg.BatchSize {
			select {
			case ev := <-l.in:
				batch = append(batch, ev)
			case <-flush.C:
				break fill
			case <-ctx.Done():
				flush.Stop()
				return
			}
		}
		flush.Stop()
		ok, err := l.publish(ctx, batch)
		var a laneAck
		switch {
		case err != nil:
			a.err = err
		case !ok:
			return // ctx ended: unacknowledged, so unconfirmed
		default:
			a.txs = make([]*txn, len(batch))
			for i, ev := range batch {
				a.txs[i] = ev.tx
			}
		}
		select {
		case l.acked <- a:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// publish writes events until Kafka acknowledged every one of them and
// reports true; false if ctx ended first. Broker errors are waited out with
// capped backoff; an event Kafka refuses because of the message
// MaxAttempts times is skipped as dead.
func (l *lane) publish(ctx context.Context, todo []cdcEvent) (bool, error) {
	r := l.r
	if l.reload {
		l.deadAhead, l.reload = nil, false
	}
	if !l.loadDeadAhead(ctx) {
		return false, nil
	}
	if l.deadAhead == nil {
		// Unread: nothing is held in this batch; read again on the next.
		l.deadAhead, l.reload = map[string]string{}, true
	}
	idx, ok := l.dropSettled(ctx, todo)
	if !ok {
		return false, nil
	}
	attempts := make(map[int]int) // index into todo -> message-error attempts
	kafkaStreak := 0
	for len(idx) > 0 {
		if idx = l.holdBehindDead(ctx, todo, idx); len(idx) == 0 {
			break
		}
		// startSends replaces a message's headers rather than write to
		// them, so a retry starts from the stored traceparent again.
		batch := make([]claimed, len(idx))
		for j, i := range idx {
			batch[j] = todo[i].claimed
		}
		r.cfg.Metrics.batchSize.Observe(float64(len(batch)))
		endSends := startSends(ctx, batch)
		pubCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		errs := publishBatch(pubCtx, r.writer, batch)
		cancel()
		endSends(errs)
		if ctx.Err() != nil {
			return false, nil
		}
		var (
			retryIdx    []int
			brokerErr   error
			judged, ack int
		)
		now := time.Now()
		for j, i := range idx {
			switch err := errs[j]; {
			case err == nil:
				ack++
				r.cfg.Metrics.publishLag.Observe(now.Sub(todo[i].createdAt).Seconds())
				if attempts[i] > 0 {
					r.cfg.Metrics.retries.Inc()
				}
			case errors.Is(err, errHeldBack):
				// Not written: an earlier event of its aggregate failed. It
				// goes again with that one, uncharged, and after it.
				retryIdx = append(retryIdx, i)
			case kafkaerr.IsMessageError(err):
				judged++
				attempts[i]++
				r.cfg.Metrics.failures.Inc()
				if attempts[i] >= r.cfg.MaxAttempts {
					r.dead(ctx, todo[i], err)
					if todo[i].rowID != 0 {
						if _, held := l.deadAhead[todo[i].aggregate]; !held {
							l.deadAhead[todo[i].aggregate] = header(todo[i].msg, event.HeaderEventID)
						}
					}
					continue
				}
				retryIdx = append(retryIdx, i)
			default:
				r.cfg.Metrics.kafkaErrors.Inc()
				if brokerErr == nil {
					brokerErr = err
				}
				retryIdx = append(retryIdx, i)
			}
		}
		r.cfg.Metrics.published.Add(float64(ack))
		if brokerErr != nil && ack == 0 && judged == 0 {
			kafkaStreak++
			l.kafka.fail(ctx, brokerErr)
			r.topicDown(l.topic)
		} else {
			kafkaStreak = 0
			// Some partitions took writes while others refused: not a
			// recovery yet; the lane retries exactly the refused events, and
			// Kafka works again once a round has none.
			if brokerErr != nil {
				l.kafka.fail(ctx, brokerErr)
			} else {
				l.kafka.ok(ctx)
			}
			r.topicUp(l.topic)
		}
		idx = retryIdx
		if len(idx) == 0 {
			break
		}
		delay := retry.Backoff(max(kafkaStreak, 1), r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)
		if brokerErr == nil {
			delay = retry.Backoff(attempts[idx[0]], r.cfg.BackoffMin, r.cfg.BackoffMax)
		}
		if !retry.Sleep(ctx, delay) {
			return false, nil
		}
	}
	if err := faultpoint.Pass(ctx, faultpoint.OutboxAfterAck); err != nil {
		return false, err
	}
	return true, nil
}

// laneCheckAttempts bounds how often a lane tries a database read it
// makes before publishing (loadDeadAhead, dropSettled): it must never wait
// the database out. A shutting-down Postgres waits for its walsenders to
// have every WAL record sent and confirmed, and a lane stuck on the
// database would stop the stream being read and confirmed: each would wait
// for the other for good. Past these attempts the lane publishes without
// the read, which can only put a held or already-settled row on the topic
// again (a duplicate, or an order consumers see broken), and logs it.
const laneCheckAttempts = 3

// loadDeadAhead reads the aggregates held by a dead row, once per lane
// (retried on the next batch when the database could not answer); false
// if ctx ended first.
func (l *lane) loadDeadAhead(ctx context.Context) bool {
	for attempt := 1; l.deadAhead == nil; attempt++ {
		rows, err := l.r.pool.Query(ctx, firstDeadRows)
		held := map[string]string{}
		if err == nil {
			var typ, agg, id string
			_, err = pgx.ForEachRow(rows, []any{&typ, &agg, &id}, func() error {
				held[typ+"\x00"+agg] = id // claimed.aggregate's form
				return nil
			})
		}
		if err == nil {
			l.deadAhead = held
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		l.r.cfg.Metrics.dbErrors.WithLabelValues("slot").Inc()
		if attempt >= laneCheckAttempts {
			l.r.cfg.Logger.ErrorContext(ctx, "outbox relay could not read the dead rows that hold back their aggregates; publishing this batch without holding them",
				slog.String("topic", l.topic), slog.Any("error", err))
			return true
		}
		if !retry.Sleep(ctx, retry.Backoff(attempt, l.r.cfg.OutageBackoffMin, l.r.cfg.OutageBackoffMax)) {
			return false
		}
	}
	return true
}

// dropSettled returns the indexes of todo to publish: all but the table
// rows that are settled already (settledRows). The stream delivers again
// whatever the slot had not confirmed when a relay stopped; a row of that
// stretch that went dead meanwhile stays dead (published now, it would
// overtake the dead one before it), and one an operator requeued meanwhile
// (deleted, written again under a new id) goes out as its copy, in its new
// place. Only rows that may be of that stretch are read (cdcEvent.recheck):
// a stream past it costs no statement. It tries the read
// laneCheckAttempts times; false if ctx ended first.
func (l *lane) dropSettled(ctx context.Context, todo []cdcEvent) ([]int, bool) {
	var (
		ids      []int64
		eventIDs []string
	)
	for _, e := range todo {
		if e.rowID != 0 && e.recheck {
			ids = append(ids, e.rowID)
			eventIDs = append(eventIDs, header(e.msg, event.HeaderEventID))
		}
	}
	var settled map[int64]bool
	for attempt := 1; len(ids) > 0; attempt++ {
		settled = map[int64]bool{}
		rows, err := l.r.pool.Query(ctx, settledRows, ids, eventIDs)
		if err == nil {
			var id int64
			_, err = pgx.ForEachRow(rows, []any{&id}, func() error { settled[id] = true; return nil })
		}
		if err == nil {
			break
		}
		clear(settled)
		if ctx.Err() != nil {
			return nil, false
		}
		l.r.cfg.Metrics.dbErrors.WithLabelValues("slot").Inc()
		if attempt >= laneCheckAttempts {
			l.r.cfg.Logger.ErrorContext(ctx, "outbox relay could not read its rows' states before publishing them; publishing them all",
				slog.String("topic", l.topic), slog.Any("error", err))
			break
		}
		if !retry.Sleep(ctx, retry.Backoff(attempt, l.r.cfg.OutageBackoffMin, l.r.cfg.OutageBackoffMax)) {
			return nil, false
		}
	}
	idx := make([]int, 0, len(todo))
	for i, e := range todo {
		if !settled[e.rowID] {
			idx = append(idx, i)
		}
	}
	return idx, true
}

// holdBehindDead returns idx without the table rows of aggregates that a
// dead row holds, each marked dead behind it ("held back behind dead event
// …") instead of published, so that a consumer never sees an aggregate's
// later event before its earlier, dead one: requeueing the dead row and
// then those behind it publishes them in order. The requeued copy of the
// holding row itself goes out, and lifts the hold. An emitted event
// (WAL-only mode) has no row to hold or requeue: it is never held.
func (l *lane) holdBehindDead(ctx context.Context, todo []cdcEvent, idx []int) []int {
	if len(l.deadAhead) == 0 {
		return idx
	}
	kept := idx[:0:0]
	for _, i := range idx {
		e := todo[i]
		first, held := l.deadAhead[e.aggregate]
		switch {
		case !held || e.rowID == 0:
			kept = append(kept, i)
		case first == header(e.msg, event.HeaderEventID):
			// The requeued copy of the holding row: it goes, and the
			// aggregate's next dead row, if any, holds from now on.
			delete(l.deadAhead, e.aggregate)
			typ, id, _ := strings.Cut(e.aggregate, "\x00")
			var next string
			err := l.r.pool.QueryRow(ctx, firstDeadRowOf, typ, id).Scan(&next)
			switch {
			case err == nil && next != first:
				l.deadAhead[e.aggregate] = next
			case err != nil && !errors.Is(err, pgx.ErrNoRows):
				// Unknown: read every hold again on the next batch.
				l.reload = true
			}
			kept = append(kept, i)
		default:
			l.r.dead(ctx, e, fmt.Errorf("held back behind dead event %s of its aggregate: requeue that one first", first))
		}
	}
	return kept
}

// topicDown and topicUp keep the relay's view of Kafka: connected
// (outbox_kafka_connected) while no topic's writes fail for the broker's
// sake.
func (r *CDCRelay) topicDown(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downTopics[topic] = true
	r.cfg.Metrics.kafkaConnected.Set(0)
}

func (r *CDCRelay) topicUp(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.downTopics, topic)
	if len(r.downTopics) == 0 {
		r.cfg.Metrics.kafkaConnected.Set(1)
	}
}

// dead skips an event Kafka keeps refusing because of the message (or one
// held back behind such an event, holdBehindDead): logged
// with its identity, counted in outbox_dead_total, and, for a table row,
// marked dead (retention keeps dead rows; outbox_dead_events counts them)
// so an operator can find it.
func (r *CDCRelay) dead(ctx context.Context, e cdcEvent, cause error) {
	r.cfg.Metrics.deadTotal.Inc()
	msg := "outbox event skipped as dead; its aggregate's later events are held back behind it until it is requeued"
	if e.rowID == 0 {
		msg = "outbox event skipped as dead; WAL-only: it is in this log only, and its aggregate's later events go on"
	}
	r.cfg.Logger.ErrorContext(ctx, msg,
		slog.String("event_id", header(e.msg, event.HeaderEventID)), slog.String("topic", e.msg.Topic),
		slog.String("aggregate_id", string(e.msg.Key)), slog.Int64("outbox_id", e.rowID), slog.Any("error", cause))
	if e.rowID == 0 {
		return
	}
	if _, err := r.pool.Exec(ctx, markDeadCDC, e.rowID, cause.Error(), r.cfg.MaxAttempts); err != nil && ctx.Err() == nil {
		r.cfg.Metrics.dbErrors.WithLabelValues("slot").Inc()
		r.cfg.Logger.ErrorContext(ctx, "could not mark the skipped outbox row dead", slog.Int64("outbox_id", e.rowID), slog.Any("error", err))
	}
}
