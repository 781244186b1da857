package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
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
	attempts := make(map[int]int) // index into todo -> message-error attempts
	idx := make([]int, len(todo))
	for i := range idx {
		idx[i] = i
	}
	kafkaStreak := 0
	for len(idx) > 0 {
		batch := make([]claimed, len(idx))
		for j, i := range idx {
			batch[j] = todo[i].claimed
			// startSends rewrites the traceparent header: a retry starts
			// from the stored one again.
			batch[j].msg.Headers = append([]kafka.Header(nil), todo[i].msg.Headers...)
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
			r.topicDown(l.topic, brokerErr)
		} else {
			kafkaStreak = 0
			l.kafka.ok(ctx)
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
		if !sleep(ctx, delay) {
			return false, nil
		}
	}
	if r.cfg.CrashPoint != nil {
		if err := r.cfg.CrashPoint(CrashAfterAck); err != nil {
			return false, fmt.Errorf("crash point %s: %w", CrashAfterAck, err)
		}
	}
	return true, nil
}

// topicDown and topicUp keep the relay's view of Kafka: connected while no
// topic's writes fail for the broker's sake (outbox_kafka_connected,
// Health), since the first that began failing otherwise.
func (r *CDCRelay) topicDown(topic string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.downTopics[topic]; ok {
		d.err = err
		r.downTopics[topic] = d
	} else {
		r.downTopics[topic] = topicOutage{since: time.Now(), err: err}
	}
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

// topicOutage is one topic whose writes fail because of the broker.
type topicOutage struct {
	since time.Time
	err   error
}

const markDeadCDC = `UPDATE outbox_events SET state = 'dead', last_error = $2, attempts = $3 WHERE id = $1`

// dead skips an event Kafka keeps refusing because of the message: logged
// with its identity, counted in outbox_dead_total, and, for a table row,
// marked dead (retention keeps dead rows; outbox_dead_events counts them)
// so an operator can find it.
func (r *CDCRelay) dead(ctx context.Context, e cdcEvent, cause error) {
	r.cfg.Metrics.deadTotal.Inc()
	r.cfg.Logger.ErrorContext(ctx, "outbox event refused by Kafka because of the message; skipped as dead (its aggregate's later events go on)",
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
