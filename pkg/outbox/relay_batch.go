package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
	"github.com/onceflow/onceflow/pkg/internal/kafkaerr"
	"github.com/onceflow/onceflow/pkg/internal/retry"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// batchResult is what one batch did.
type batchResult struct {
	claimed   int
	published int
	judged    int   // rows refused because of the message (by the broker, or undecodable)
	brokerErr error // the first error about the broker; nil if none
	// armed and disarmed say that the batch's round trips changed the
	// relay's wake-up (wakeOps).
	armed, disarmed bool
}

// relayOneBatch claims, publishes and marks one batch of the owned
// partitions, returning how many rows it claimed. Run works in the same
// steps; this package's tests and benchmarks drive the relay through it one
// batch at a time (export_test.go). Called outside Run it first takes this
// relay's share of the partitions. It must not be called concurrently with
// Run.
// Rows Kafka could not take because of the broker stay pending, deferred
// for the relay's outage backoff without an attempt charged; they count as
// claimed.
func (r *Relay) relayOneBatch(ctx context.Context) (int, error) {
	if r.owner.conn == nil {
		r.rebalance(ctx)
	}
	res, err := r.relayBatch(ctx, wakeOps{})
	if err == nil {
		r.noteKafka(ctx, res)
	}
	return res.claimed, err
}

// relayBatch claims, publishes and marks one batch in two round trips to
// Postgres, each a pipeline of statements (pgx.Batch): the first begins the
// transaction, sets it up, takes the partition fences and claims (arming
// first, in a transaction of its own, when ops.arm); the second records the
// outcome of every row and commits (disarming on the way, per ops). A claim
// that finds nothing costs the same two.
func (r *Relay) relayBatch(ctx context.Context, ops wakeOps) (res batchResult, err error) {
	owned := r.owner.partitions()
	if len(owned) == 0 {
		return batchResult{}, nil
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return batchResult{}, fmt.Errorf("acquiring a connection to claim: %w", err)
	}
	inTx := false
	defer func() {
		if inTx {
			// A failed statement or a crash point left the transaction
			// open: end it, so that the connection goes back to the pool
			// clean (the pool would destroy it otherwise).
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r.cfg.Metrics.RoundTrips.WithLabelValues("rollback").Inc()
			_, _ = conn.Exec(rctx, "rollback")
			cancel()
		}
		conn.Release()
	}()

	undefer := r.undefer
	claim := &pgx.Batch{}
	if ops.arm {
		claim.Queue("begin")
		claim.Queue(arm, r.cfg.ID, advisoryLockClass, wakeFenceKey)
		claim.Queue("commit")
	}
	// owned is sorted (owner.set), so concurrent fences take their locks in
	// one order and cannot deadlock.
	claim.Queue("begin")
	claim.Queue(claimSettings, strconv.FormatInt(r.cfg.LockTimeout.Milliseconds(), 10))
	claim.Queue(fencePartitions, fenceLockClass, owned)
	if len(undefer) > 0 {
		claim.Queue(undeferOutage, owned, undefer)
	}
	claim.Queue(claimBatch, r.cfg.BatchSize, owned)
	r.cfg.Metrics.RoundTrips.WithLabelValues("claim").Inc()
	r.cfg.Metrics.Claims.Inc()
	inTx = true
	batch, armed, err := r.readClaim(claim, conn.SendBatch(ctx, claim), ops.arm)
	res.armed = armed
	if err != nil {
		return res, err
	}
	rate := r.noteRate(len(batch), time.Now())
	if len(batch) == 0 {
		r.cfg.Metrics.EmptyClaims.Inc()
		r.cfg.Metrics.RoundTrips.WithLabelValues("commit").Inc()
		inTx = false
		if _, err := conn.Exec(ctx, "commit"); err != nil {
			return res, fmt.Errorf("ending an empty claim: %w", err)
		}
		if len(undefer) > 0 {
			r.undefer = nil
		}
		return res, nil
	}
	r.cfg.Metrics.BatchSize.Observe(float64(len(batch)))
	if err := r.standby.Await(ctx, conn); err != nil {
		// The rows stay pending, uncharged: the rollback releases them,
		// and the relay backs off as from any Postgres outage.
		return res, err
	}

	// Publish only what can be published in order: an undecodable row, and
	// the later rows of its aggregate, stay behind it.
	held := map[string]bool{} // aggregates with an earlier row of this batch not published
	var sends []publish.Claimed
	for _, c := range batch {
		switch {
		case c.Undecodable != nil:
			held[c.Aggregate] = true
		case !held[c.Aggregate]:
			sends = append(sends, c)
		}
	}
	endSends := publish.StartSends(ctx, sends)
	publishCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	errs := publish.Batch(publishCtx, r.writer, sends)
	cancel()
	endSends(errs)
	if ctx.Err() != nil {
		return res, ctx.Err() // leave the rows pending; the next run republishes them
	}
	if err := faultpoint.Pass(ctx, faultpoint.OutboxAfterAck); err != nil {
		return res, err
	}
	cause := make(map[int64]error, len(sends))
	for i, c := range sends {
		cause[c.ID] = errs[i]
	}

	res.claimed = len(batch)
	var (
		published             []int64
		failed                []publish.Claimed
		failedCauses          []error
		deferIDs, deferDelays []int64
		deferErrs             []string
		brokerTopics          = map[string]bool{}
		okTopics              = map[string]bool{}
	)
	clear(held)
	now := time.Now()
	for _, c := range batch {
		err, sent := cause[c.ID]
		if c.Undecodable != nil {
			err = c.Undecodable
		}
		if sent && err != nil && !kafkaerr.IsMessageError(err) && !errors.Is(err, publish.ErrHeldBack) {
			r.cfg.Metrics.KafkaErrors.Inc()
		}
		switch {
		case held[c.Aggregate] || errors.Is(err, publish.ErrHeldBack):
			// An earlier event of this aggregate failed: leave this one
			// pending and untouched, so that it is retried after that event
			// and keeps order. writeTopic did not give it to the broker; the
			// failed row now holds the aggregate back (claimBatch).
		case err == nil:
			published = append(published, c.ID)
			okTopics[c.Msg.Topic] = true
			r.refused.take(c.Msg.Topic, c.Aggregate)
			r.cfg.Metrics.PublishLag.Observe(now.Sub(c.CreatedAt).Seconds())
			if c.Attempts > 0 {
				r.cfg.Metrics.Retries.Inc()
			}
		case c.Undecodable != nil || kafkaerr.IsMessageError(err):
			held[c.Aggregate] = true
			res.judged++
			if c.Undecodable == nil {
				okTopics[c.Msg.Topic] = true
			}
			failed, failedCauses = append(failed, c), append(failedCauses, err)
		default:
			held[c.Aggregate] = true
			brokerTopics[c.Msg.Topic] = true
			r.refused.refuse(c.Msg.Topic, c.Aggregate, now)
			if res.brokerErr == nil {
				res.brokerErr = err
			}
			// Deferred by how long this topic has been failing, so a topic
			// that stays unavailable is retried ever less often while the
			// other topics flow.
			delay := retry.Backoff(r.topicStreak[c.Msg.Topic]+1, r.cfg.OutageBackoffMin, r.cfg.OutageBackoffMax)
			deferIDs, deferErrs, deferDelays = append(deferIDs, c.ID), append(deferErrs, err.Error()), append(deferDelays, delay.Microseconds())
			if r.deferredTypes[c.Msg.Topic] == nil {
				r.deferredTypes[c.Msg.Topic] = map[string]bool{}
			}
			r.deferredTypes[c.Msg.Topic][c.AggType] = true
		}
	}

	finish := &pgx.Batch{}
	delays := make([]time.Duration, len(failed))
	for i, c := range failed {
		r.cfg.Metrics.Failures.Inc()
		delays[i] = retry.Backoff(c.Attempts+1, r.cfg.BackoffMin, r.cfg.BackoffMax)
		finish.Queue(markFailed, c.ID, failedCauses[i].Error(), delays[i].Microseconds(), r.cfg.MaxAttempts)
	}
	if len(published) > 0 {
		finish.Queue(markPublished, published)
	}
	if len(deferIDs) > 0 {
		finish.Queue(markDeferred, deferIDs, deferErrs, deferDelays)
	}
	disarming := ops.disarmIfBusy && (len(batch) >= r.cfg.BatchSize || rate > busyRate)
	if disarming {
		finish.Queue(disarm, r.cfg.ID)
	}
	finish.Queue("commit")
	r.cfg.Metrics.RoundTrips.WithLabelValues("commit").Inc()
	states, marked, err := readFinish(conn.SendBatch(ctx, finish), len(failed), len(published) > 0)
	if err != nil {
		return res, err
	}
	inTx = false
	res.disarmed = disarming
	if marked != int64(len(published)) {
		// The claim holds the rows locked, so this is a bug, not a race: seen.
		r.cfg.Metrics.set().Refuse(ctx, r.cfg.Logger, lifecycle.TransitionMarkPublished, "claimed rows were not pending when marked published",
			slog.Int("published", len(published)), slog.Int64("marked", marked))
	}
	for i, c := range failed {
		if states[i] == "" {
			r.cfg.Metrics.set().Refuse(ctx, r.cfg.Logger, lifecycle.TransitionMarkFailed, "a claimed row was not pending when its failure was recorded",
				slog.Int64("outbox_id", c.ID))
			continue
		}
		r.logFailed(ctx, c, failedCauses[i], delays[i], states[i])
	}
	if len(undefer) > 0 {
		r.undefer = nil
	}
	for topic := range brokerTopics {
		r.topicStreak[topic]++
	}
	for topic := range okTopics {
		if brokerTopics[topic] {
			continue
		}
		// The topic works again: what its outage deferred may go now.
		delete(r.topicStreak, topic)
		for t := range r.deferredTypes[topic] {
			if !slices.Contains(r.undefer, t) {
				r.undefer = append(r.undefer, t)
			}
		}
		delete(r.deferredTypes, topic)
	}
	res.published = len(published)
	r.cfg.Metrics.Published.Add(float64(len(published)))
	return res, nil
}

// readClaim reads the results of the claim's pipeline, in the order
// relayBatch queued them, and reports whether arming took.
func (r *Relay) readClaim(b *pgx.Batch, br pgx.BatchResults, arming bool) (batch []publish.Claimed, armed bool, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("claiming batch: %w", cerr)
		}
	}()
	n := len(b.QueuedQueries)
	for i := 0; i < n-1; i++ {
		tag, err := br.Exec()
		if err != nil {
			return nil, armed, fmt.Errorf("setting up the claim (%s): %w", firstWord(b.QueuedQueries[i].SQL), err)
		}
		if arming && i == 1 {
			armed = tag.RowsAffected() == 1
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, armed, fmt.Errorf("claiming batch: %w", err)
	}
	batch, err = pgx.CollectRows(rows, r.scanClaimed)
	if err != nil {
		return nil, armed, fmt.Errorf("reading claimed rows: %w", err)
	}
	return batch, armed, nil
}

// firstWord names a statement in an error without quoting all of it.
func firstWord(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \n"); i > 0 {
		return sql[:i]
	}
	return sql
}

// readFinish reads the results of the finishing pipeline: the state each
// failed row was left in, then the marks and the commit.
func readFinish(br pgx.BatchResults, failed int, published bool) (states []string, marked int64, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("committing batch: %w", cerr)
		}
	}()
	states = make([]string, failed)
	for i := range states {
		// No row: it was not pending (markFailed names the state it
		// expects); states[i] stays "" and the caller counts it refused.
		if err := br.QueryRow().Scan(&states[i]); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, 0, fmt.Errorf("recording failed publish: %w", err)
		}
	}
	if published {
		tag, err := br.Exec()
		if err != nil {
			return nil, 0, fmt.Errorf("marking published: %w", err)
		}
		marked = tag.RowsAffected()
	}
	return states, marked, nil
}

// scanClaimed reads one claimed row. A row whose headers cannot be decoded
// is returned with undecodable set rather than failing the claim: the claim
// would fail the same way on every try, and nothing else would ever move.
func (r *Relay) scanClaimed(row pgx.CollectableRow) (publish.Claimed, error) {
	var (
		c       publish.Claimed
		ev      event.Envelope
		headers []byte
	)
	// *[16]byte, not *uuid.UUID: pgx decodes it natively instead of
	// through sql.Scanner and text, a tenth of the claim's CPU.
	err := row.Scan(&c.ID, (*[16]byte)(&ev.EventID), &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion,
		&ev.EventType, &ev.EventVersion, &ev.Payload, &headers, &ev.OccurredAt, &c.CreatedAt, &c.Attempts)
	if err != nil {
		return c, err
	}
	c.AggType = ev.AggregateType
	c.Aggregate = ev.AggregateType + "\x00" + ev.AggregateID
	var h publish.Headers
	if err := json.Unmarshal(headers, &h); err != nil {
		c.Msg.Topic = r.cfg.Topic(ev.AggregateType)
		c.Undecodable = fmt.Errorf("%w: event %s: decoding the headers column: %w", publish.ErrUndecodable, ev.EventID, err)
		return c, nil
	}
	ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
	c.Msg = event.ToKafka(r.cfg.Topic(ev.AggregateType), ev)
	return c, nil
}

// logFailed logs a row whose publish failed because of the message, now
// that its new state is committed.
func (r *Relay) logFailed(ctx context.Context, c publish.Claimed, cause error, delay time.Duration, state string) {
	log := r.cfg.Logger.With(slog.Int64("outbox_id", c.ID), slog.String("topic", c.Msg.Topic),
		slog.Int("attempt", c.Attempts+1), slog.Any("error", cause))
	if state == "dead" {
		r.cfg.Metrics.DeadTotal.Inc()
		log.ErrorContext(ctx, "outbox event is dead after its last attempt; its aggregate's later events wait until it is requeued")
		return
	}
	log.WarnContext(ctx, "outbox publish failed because of the message; will retry", slog.Duration("retry_in", delay))
}
