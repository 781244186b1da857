package cdc

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
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/outage"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// lane publishes the events of one topic, in the order they were decoded,
// as the polling relay writes each topic on its own: a topic whose writes
// fail (deleted, its leader away, refused by an ACL) holds back its own
// events only, while the stream goes on for the others until this lane's
// queue (Config.MaxInFlight events) is full. The slot stays confirmed
// before its first unacknowledged event, so nothing is lost either way.
type lane struct {
	r     *Relay
	topic string
	in    chan cdcEvent
	acked chan<- laneAck
	kafka *outage.Outage

	// deadAhead holds, per aggregate (type and id), its dead outbox row of
	// the lowest aggregate version: in table mode a dead event holds back
	// its aggregate's later events, as in the polling relay, so they are
	// marked dead behind it instead of published ahead of it. By version,
	// not by id: a requeue writes a copy under a new, higher id, and that
	// copy, refused again, is still its aggregate's head. Its requeued copy
	// (the same event id, a new row) lifts the hold; the aggregate's next
	// dead row, if any, takes its place. Loaded by the stream before it
	// delivers anything (loadHolds), so a restart keeps the holds and a
	// copy requeued meanwhile finds its place.
	deadAhead map[string]hold
}

// hold is the dead event an aggregate's later events wait behind.
type hold struct {
	eventID string
	version int64
}

func (r *Relay) newLane(topic string, acked chan<- laneAck, holds map[string]hold) *lane {
	if holds == nil {
		holds = map[string]hold{}
	}
	return &lane{r: r, topic: topic, in: make(chan cdcEvent, r.cfg.MaxInFlight), acked: acked, deadAhead: holds,
		kafka: outage.New("publishing to Kafka topic "+topic, r.cfg.Logger, r.cfg.LogInterval)}
}

// run publishes until ctx ends. A batch is whatever the queue holds, up to
// BatchSize, after waiting FlushDelay for more to join a short one while
// events flow: an event that finds the lane idle since longer than
// FlushDelay (a relay at a low rate, one event every few milliseconds)
// goes at once, since nothing would join it, and waiting only added the
// delay and a timer's wake-up to every event.
func (l *lane) run(ctx context.Context) {
	defer l.r.topicUp(l.topic) // a lane that stops is no longer down
	batch := make([]cdcEvent, 0, l.r.cfg.BatchSize)
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	defer flush.Stop()
	var published time.Time // when the last batch was acknowledged
	for {
		batch = batch[:0]
		select {
		case ev := <-l.in:
			batch = append(batch, ev)
		case <-ctx.Done():
			return
		}
		// What queued up while the last batch was in flight joins at once.
	queued:
		for len(batch) < l.r.cfg.BatchSize {
			select {
			case ev := <-l.in:
				batch = append(batch, ev)
			default:
				break queued
			}
		}
		if len(batch) < l.r.cfg.BatchSize && time.Since(published) < l.r.cfg.FlushDelay {
			flush.Reset(l.r.cfg.FlushDelay)
		fill:
			for len(batch) < l.r.cfg.BatchSize {
				select {
				case ev := <-l.in:
					batch = append(batch, ev)
				case <-flush.C:
					break fill
				case <-ctx.Done():
					return
				}
			}
			flush.Stop()
		}
		ok, err := l.publish(ctx, batch)
		published = time.Now()
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
	idx, ok, err := l.dropSettled(ctx, todo)
	if err != nil || !ok {
		return false, err
	}
	attempts := make(map[int]int) // index into todo -> message-error attempts
	kafkaStreak := 0
	for len(idx) > 0 {
		var err error
		if idx, err = l.holdBehindDead(ctx, todo, idx); err != nil {
			return false, err
		} else if len(idx) == 0 {
			break
		}
		// publish.Send (its StartSends) replaces a message's headers rather than write to
		// them, so a retry starts from the stored traceparent again.
		batch := make([]publish.Claimed, len(idx))
		for j, i := range idx {
			batch[j] = todo[i].Claimed
		}
		r.cfg.Metrics.BatchSize.Observe(float64(len(batch)))
		errs := publish.Send(ctx, r.writer, r.cfg.PublishTimeout, batch)
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
				r.cfg.Metrics.PublishLag.Observe(now.Sub(todo[i].CreatedAt).Seconds())
				if attempts[i] > 0 {
					r.cfg.Metrics.Retries.Inc()
				}
			case errors.Is(err, publish.ErrHeldBack):
				// Not written: an earlier event of its aggregate failed. It
				// goes again with that one, uncharged, and after it.
				retryIdx = append(retryIdx, i)
			case kafkaerr.IsMessageError(err):
				judged++
				attempts[i]++
				r.cfg.Metrics.Failures.Inc()
				if attempts[i] >= r.cfg.MaxAttempts {
					// Acknowledged (and so confirmed past) only once its
					// dead mark is durable: otherwise the stream ends
					// here, and the next one delivers it again.
					if err := r.dead(ctx, todo[i], err); err != nil {
						return false, err
					}
					// Even when the mark was refused: the row was dead
					// already, or requeued, and then its copy comes later
					// in the stream than the aggregate's events committed
					// before the requeue, which must wait behind it; the
					// copy lifts the hold when it arrives
					// (TestCDCRefusedDeadMarkOfARequeuedRowHoldsUntilTheCopy).
					l.holdFrom(todo[i])
					continue
				}
				retryIdx = append(retryIdx, i)
			default:
				r.cfg.Metrics.KafkaErrors.Inc()
				if brokerErr == nil {
					brokerErr = err
				}
				retryIdx = append(retryIdx, i)
			}
		}
		r.cfg.Metrics.Published.Add(float64(ack))
		if brokerErr != nil && ack == 0 && judged == 0 {
			kafkaStreak++
			l.kafka.Fail(ctx, brokerErr)
			r.topicDown(l.topic)
		} else {
			kafkaStreak = 0
			// Some partitions took writes while others refused: not a
			// recovery yet; the lane retries exactly the refused events, and
			// Kafka works again once a round has none.
			if brokerErr != nil {
				l.kafka.Fail(ctx, brokerErr)
			} else {
				l.kafka.OK(ctx)
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

// laneCheckAttempts bounds how often a lane tries the read it makes
// before publishing (dropSettled): it must never wait the database out. A
// shutting-down Postgres waits for its walsenders to have every WAL record
// sent and confirmed, and a lane stuck on the database would stop the
// stream being read and confirmed: each would wait for the other for good.
// Past these attempts the lane ends the stream, unacknowledged, as a failed
// dead mark does: closing the replication connection releases such a
// shutdown, and the next stream delivers the rows again and reads again.
// Publishing them without the read instead would put a row already settled
// (dead, or requeued under a new id) on the topic again: a dead event
// reaching consumers, and its requeued copy later coming after its
// aggregate's next events (invariant 4).
const laneCheckAttempts = 3

// dropSettled returns the indexes of todo to publish: all but the table
// rows that are settled already (settledRows). The stream delivers again
// whatever the slot had not confirmed when a relay stopped; a row of that
// stretch that went dead meanwhile stays dead (published now, it would
// overtake the dead one before it), and one an operator requeued meanwhile
// (deleted, written again under a new id) goes out as its copy, in its new
// place. Only rows that may be of that stretch are read (cdcEvent.recheck):
// a stream past it costs no statement. It tries the read
// laneCheckAttempts times, then returns the error (the stream ends); false
// if ctx ended first.
func (l *lane) dropSettled(ctx context.Context, todo []cdcEvent) ([]int, bool, error) {
	var (
		ids      []int64
		eventIDs []string
	)
	for _, e := range todo {
		if e.rowID != 0 && e.recheck {
			ids = append(ids, e.rowID)
			eventIDs = append(eventIDs, publish.Header(e.Msg, event.HeaderEventID))
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
		if ctx.Err() != nil {
			return nil, false, nil
		}
		l.r.cfg.Metrics.DbErrors.WithLabelValues("slot").Inc()
		if attempt >= laneCheckAttempts {
			return nil, false, fmt.Errorf("reading the states of %d redelivered outbox rows before publishing them (not acknowledged: the next stream delivers them again): %w",
				len(ids), err)
		}
		if !retry.Sleep(ctx, retry.Backoff(attempt, l.r.cfg.OutageBackoffMin, l.r.cfg.OutageBackoffMax)) {
			return nil, false, nil
		}
	}
	idx := make([]int, 0, len(todo))
	for i, e := range todo {
		if !settled[e.rowID] {
			idx = append(idx, i)
		}
	}
	return idx, true, nil
}

// holdBehindDead returns idx without the table rows of aggregates that a
// dead row holds, each marked dead behind it ("held back behind dead event
// …") instead of published, so that a consumer never sees an aggregate's
// later event before its earlier, dead one: requeueing the dead row and
// then those behind it publishes them in order. The requeued copy of the
// holding row itself goes out, and lifts the hold; so does an event of a
// lower version than the hold, which comes before it in its aggregate. An
// emitted event (WAL-only mode) has no row to hold or requeue: it is never
// held. An error (a mark or a read that failed) ends the stream: nothing
// of the batch is acknowledged.
func (l *lane) holdBehindDead(ctx context.Context, todo []cdcEvent, idx []int) ([]int, error) {
	if len(l.deadAhead) == 0 {
		return idx, nil
	}
	kept := idx[:0:0]
	for _, i := range idx {
		e := todo[i]
		h, held := l.deadAhead[e.Aggregate]
		switch {
		case !held || e.rowID == 0 || e.version < h.version:
			kept = append(kept, i)
		case h.eventID == publish.Header(e.Msg, event.HeaderEventID):
			// The requeued copy of the holding row: it goes, and the
			// aggregate's next dead row, if any, holds from now on.
			delete(l.deadAhead, e.Aggregate)
			typ, id, _ := strings.Cut(e.Aggregate, "\x00")
			var next hold
			err := l.r.pool.QueryRow(ctx, firstDeadRowOf, typ, id).Scan(&next.eventID, &next.version)
			switch {
			case err == nil && next.eventID != h.eventID:
				l.deadAhead[e.Aggregate] = next
			case err != nil && !errors.Is(err, pgx.ErrNoRows):
				l.r.cfg.Metrics.DbErrors.WithLabelValues("slot").Inc()
				return nil, fmt.Errorf("reading the next dead event of aggregate %s/%s: %w", typ, id, err)
			}
			kept = append(kept, i)
		default:
			if err := l.r.dead(ctx, e, fmt.Errorf("held back behind dead event %s of its aggregate: requeue that one first", h.eventID)); err != nil {
				return nil, err
			}
		}
	}
	return kept, nil
}

// holdFrom makes e, just marked dead, its aggregate's hold unless an
// earlier version holds it already.
func (l *lane) holdFrom(e cdcEvent) {
	if e.rowID == 0 {
		return
	}
	if h, held := l.deadAhead[e.Aggregate]; !held || e.version < h.version {
		l.deadAhead[e.Aggregate] = hold{eventID: publish.Header(e.Msg, event.HeaderEventID), version: e.version}
	}
}

// loadHolds reads, per topic, the aggregates a dead row holds (their dead
// row of the lowest version): the stream loads them before it delivers
// anything, so that a restarted relay keeps them and an event can never
// be published ahead of a hold it has not read yet.
func (r *Relay) loadHolds(ctx context.Context) (map[string]map[string]hold, error) {
	rows, err := r.pool.Query(ctx, firstDeadRows)
	if err != nil {
		return nil, fmt.Errorf("reading the dead rows that hold back their aggregates: %w", err)
	}
	holds := map[string]map[string]hold{}
	var (
		typ, agg string
		h        hold
	)
	_, err = pgx.ForEachRow(rows, []any{&typ, &agg, &h.eventID, &h.version}, func() error {
		topic := r.cfg.Topic(typ)
		if holds[topic] == nil {
			holds[topic] = map[string]hold{}
		}
		holds[topic][typ+"\x00"+agg] = h // claimed.aggregate's form
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the dead rows that hold back their aggregates: %w", err)
	}
	return holds, nil
}

// topicDown and topicUp keep the relay's view of Kafka: connected
// (outbox_kafka_connected) while no topic's writes fail for the broker's
// sake.
func (r *Relay) topicDown(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downTopics[topic] = true
	r.cfg.Metrics.KafkaConnected.Set(0)
}

func (r *Relay) topicUp(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.downTopics, topic)
	if len(r.downTopics) == 0 {
		r.cfg.Metrics.KafkaConnected.Set(1)
	}
}

// dead skips an event Kafka keeps refusing because of the message (or one
// held back behind such an event, holdBehindDead): for a table row it
// marks the row dead (markDead; retention keeps dead rows;
// outbox_dead_events counts them) so an operator can find it, and only
// then is the event logged with its identity and counted in
// outbox_dead_total. An error means the mark is not durable: the caller
// must not acknowledge the event (the slot would be confirmed past a row
// that stays pending, and the event would be lost). A mark refused because
// the row is no longer pending (dead already, or requeued: its copy
// carries the event) is counted and logged, and the event is settled.
func (r *Relay) dead(ctx context.Context, e cdcEvent, cause error) error {
	if e.rowID != 0 {
		refused, err := r.markDead(ctx, e, cause)
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Metrics.DbErrors.WithLabelValues("slot").Inc()
			}
			return fmt.Errorf("marking outbox row %d dead (not acknowledged: the next stream delivers it again): %w", e.rowID, err)
		}
		if refused != "" {
			set(r.cfg.Metrics).Refuse(ctx, r.cfg.Logger, lifecycle.TransitionMarkDead, refused,
				slog.Int64("outbox_id", e.rowID), slog.String("event_id", publish.Header(e.Msg, event.HeaderEventID)))
			return nil
		}
	}
	r.cfg.Metrics.DeadTotal.Inc()
	msg := "outbox event skipped as dead; its aggregate's later events are held back behind it until it is requeued"
	if e.rowID == 0 {
		msg = "outbox event skipped as dead; WAL-only: it is in this log only, and its aggregate's later events go on"
	}
	r.cfg.Logger.ErrorContext(ctx, msg,
		slog.String("event_id", publish.Header(e.Msg, event.HeaderEventID)), slog.String("topic", e.Msg.Topic),
		slog.String("aggregate_id", string(e.Msg.Key)), slog.Int64("outbox_id", e.rowID), slog.Any("error", cause))
	return nil
}

// markDead takes e's row pending → dead (internal/lifecycle), or says why
// it was refused. The stream delivers a transaction once its commit is
// flushed, which is before other sessions see it: by microseconds on a lone
// server, for as long as a synchronous standby has not answered on a
// replicated one. A row not there for the UPDATE may be one whose
// transaction has not ended yet: taken for settled, its event would be
// acknowledged with the row left pending, neither published nor dead, and
// the slot confirmed past it. So a missing row is waited for while its
// transaction runs (its xid in pg_stat_activity), and refused only once
// the row is dead, requeued, or still missing after its transaction
// ended (deleted: by hand, or pruned as too old).
func (r *Relay) markDead(ctx context.Context, e cdcEvent, cause error) (refused string, err error) {
	var xid uint32
	if e.tx != nil {
		xid = e.tx.xid
	}
	started, warned, ended := time.Now(), false, false
	for attempt := 1; ; attempt++ {
		tag, err := r.pool.Exec(ctx, markDeadCDC, e.rowID, cause.Error(), r.cfg.MaxAttempts)
		if err != nil {
			return "", err
		}
		if tag.RowsAffected() == 1 {
			return "", nil
		}
		var (
			state           *string
			copied, running bool
		)
		if err := r.pool.QueryRow(ctx, rowAfterRefusedMark, e.rowID, publish.Header(e.Msg, event.HeaderEventID), int64(xid)).
			Scan(&state, &copied, &running); err != nil {
			return "", err
		}
		switch {
		case state != nil && *state != lifecycle.StatePending:
			return "the row is " + *state + " already", nil
		case copied:
			return "the row was requeued: its copy carries the event", nil
		case state != nil:
			continue // visible (and pending) since the UPDATE: again
		case !running && ended:
			return "the row is gone although its transaction ended (deleted by hand, or pruned as too old)", nil
		case !running:
			// Ended between the UPDATE and the read: one more UPDATE, whose
			// snapshot is taken after it ended, sees its row.
			ended = true
			continue
		}
		if !warned && time.Since(started) >= time.Second {
			warned = true
			r.cfg.Logger.WarnContext(ctx, msgWaitingForCommit, slog.Int64("outbox_id", e.rowID),
				slog.String("event_id", publish.Header(e.Msg, event.HeaderEventID)), slog.Uint64("xid", uint64(xid)))
		}
		if !retry.Sleep(ctx, retry.Backoff(attempt, time.Millisecond, r.cfg.OutageBackoffMax)) {
			return "", ctx.Err()
		}
	}
}

// msgWaitingForCommit is logged once a row the relay must mark dead has not
// become visible for a second after the stream delivered its commit.
const msgWaitingForCommit = "waiting for an outbox row's transaction to end before marking it dead: its commit was flushed, and the stream delivered it, but other sessions do not see it yet (a synchronous standby that has not answered?)"
