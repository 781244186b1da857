package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
)

// Writer is the part of *kafka.Writer the relay needs. It must return only
// after the broker acknowledged (RequiredAcks = RequireAll).
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// notifyChannel is where the insert trigger (migrations 0001 and 0004) and
// the operator functions wake the relays.
const notifyChannel = "outbox_events"

// wakeRelays is run by operator functions that make rows due without
// inserting them (requeue, replay), so relays need not wait for their poll.
const wakeRelays = `SELECT pg_notify('` + notifyChannel + `', '')`

// Crash points the relay passes to RelayConfig.CrashPoint.
const (
	// CrashAfterAck is between the broker's acknowledgement and marking the
	// rows published: a crash here republishes the batch after restart.
	CrashAfterAck = "outbox.after-ack"
)

// RelayConfig configures a Relay. Zero fields take the documented defaults.
type RelayConfig struct {
	// ID names this relay instance among those sharing the outbox.
	// Default: hostname-pid-random.
	ID string
	// Topic maps an aggregate type to its Kafka topic.
	// Default: aggregateType + ".events".
	Topic func(aggregateType string) string
	// BatchSize is the most rows claimed and published at once. Default 500.
	BatchSize int
	// PollInterval is how often the relay looks for work when no commit
	// notification arrives (the fallback if NOTIFY is lost). Default 1s.
	PollInterval time.Duration
	// RebalanceInterval is how often the relay heartbeats and rebalances its
	// share of the partitions, and refreshes the backlog gauges. Default 2s.
	RebalanceInterval time.Duration
	// RelayTTL is how long a relay that stopped heartbeating still counts as
	// live. Default 3 × RebalanceInterval. (A relay that dies releases its
	// partitions at once; the TTL only delays the others' larger share.)
	RelayTTL time.Duration
	// LockTimeout bounds how long a claim waits for rows another relay still
	// holds during a handover. Default 10s.
	LockTimeout time.Duration
	// MaxAttempts is how many failed publishes make a row dead. Default 10.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential, jittered delay before
	// a failed row is retried. Defaults 100ms and 1m.
	BackoffMin, BackoffMax time.Duration
	// CrashPoint, when set, is called at each named crash point (see
	// CrashAfterAck); a non-nil error aborts the batch right there, as a
	// crash would. Fault-injection harnesses use it; leave it nil otherwise.
	CrashPoint func(name string) error
	// Logger receives failures, dead rows and rebalances. Default: slog.Default().
	Logger *slog.Logger
	// Metrics receives the relay's metrics. Default: none.
	Metrics *Metrics
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.Topic == nil {
		c.Topic = func(t string) string { return t + ".events" }
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.RebalanceInterval <= 0 {
		c.RebalanceInterval = 2 * time.Second
	}
	if c.RelayTTL <= 0 {
		c.RelayTTL = 3 * c.RebalanceInterval
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = 10 * time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 10
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	return c
}

// Relay publishes pending outbox rows to Kafka and marks them published only
// after the broker acknowledged them. See the package documentation for what
// it guarantees; several relays may share one outbox.
type Relay struct {
	pool   *pgxpool.Pool
	writer Writer
	cfg    RelayConfig
	owner  *owner
}

// NewRelay returns a relay reading the outbox in pool and writing to w.
func NewRelay(pool *pgxpool.Pool, w Writer, cfg RelayConfig) (*Relay, error) {
	if pool == nil || w == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a writer")
	}
	cfg = cfg.withDefaults()
	connConfig := pool.Config().ConnConfig
	return &Relay{
		pool:   pool,
		writer: w,
		cfg:    cfg,
		owner: &owner{
			id:     cfg.ID,
			ttl:    cfg.RelayTTL,
			logger: cfg.Logger,
			dial:   func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, connConfig.Copy()) },
		},
	}, nil
}

// Run relays until ctx ends. It claims batch after batch while there is
// work; when a claim finds nothing it arms a wake-up (see arm) and sleeps
// until a transaction that wrote outbox rows commits (LISTEN/NOTIFY) or, as
// a fallback, PollInterval passes, for the partitions it owns.
func (r *Relay) Run(ctx context.Context) error {
	defer r.owner.leave()
	wake := make(chan struct{}, 1)
	listening := make(chan struct{})
	go func() { defer close(listening); r.listen(ctx, wake) }()
	defer func() { <-listening }()

	r.rebalance(ctx)
	rebalance := time.NewTicker(r.cfg.RebalanceInterval)
	defer rebalance.Stop()
	poll := time.NewTimer(0)
	defer poll.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rebalance.C:
			r.rebalance(ctx)
			continue
		case <-wake:
		case <-poll.C:
			// Re-arm on every poll: a registration that expired and was
			// re-created by the heartbeat starts unarmed.
			armed = false
		}
		armed = r.drain(ctx, armed)
		poll.Reset(r.cfg.PollInterval)
	}
}

// Close releases the relay's partitions and deregisters it, for callers of
// RelayBatch; Run does this itself when it returns.
func (r *Relay) Close() { r.owner.leave() }

// drain relays batches until a claim finds nothing while the relay is armed,
// and reports whether it is armed. A busy relay disarms, so writers stop
// notifying while it would claim their rows anyway.
func (r *Relay) drain(ctx context.Context, armed bool) bool {
	for ctx.Err() == nil {
		n, err := r.RelayBatch(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Logger.ErrorContext(ctx, "outbox relay batch failed", slog.Any("error", err))
			}
			return armed // the poll retries
		}
		switch {
		case n > 0 && armed:
			armed = !r.setWaiting(ctx, false)
		case n == 0 && armed:
			return true
		case n == 0:
			// Arm, then claim once more: rows committed before the fence
			// would not have notified.
			if armed = r.setWaiting(ctx, true); !armed {
				return false
			}
		}
	}
	return armed
}

// wakeFenceKey is the advisory lock (class advisoryLockClass) that orders
// arming against writers checking whether to notify; migration 0004 takes it
// shared in the insert trigger.
const wakeFenceKey = -1

// arm marks this relay as waiting, so writers notify on commit. Taking the
// fence exclusively waits for every writer that checked the flag before it
// was set: their rows are committed before the claim that follows arming.
const arm = `
WITH fence AS (SELECT pg_advisory_xact_lock($2::int, $3::int))
UPDATE outbox_relays SET waiting = true FROM fence WHERE id = $1`

const disarm = `UPDATE outbox_relays SET waiting = false WHERE id = $1 AND waiting`

// setWaiting arms (true) or disarms (false) commit notifications for this
// relay and reports whether it changed the flag. A relay that is not
// registered cannot arm; it relies on the poll until its next heartbeat.
func (r *Relay) setWaiting(ctx context.Context, waiting bool) bool {
	var (
		tag pgconn.CommandTag
		err error
	)
	if waiting {
		tag, err = r.pool.Exec(ctx, arm, r.cfg.ID, advisoryLockClass, wakeFenceKey)
	} else {
		tag, err = r.pool.Exec(ctx, disarm, r.cfg.ID)
	}
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "outbox relay could not change its wake-up flag; polling",
				slog.Bool("waiting", waiting), slog.Any("error", err))
		}
		return false
	}
	return tag.RowsAffected() == 1
}

func (r *Relay) rebalance(ctx context.Context) {
	if err := r.owner.rebalance(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.WarnContext(ctx, "outbox relay could not rebalance; retrying", slog.Any("error", err))
	}
	r.cfg.Metrics.ownedPartitions.Set(float64(len(r.owner.partitions())))
	if err := r.cfg.Metrics.refresh(ctx, r.pool); err != nil && ctx.Err() == nil {
		r.cfg.Logger.WarnContext(ctx, "outbox relay could not refresh its gauges", slog.Any("error", err))
	}
}

// listen forwards commit notifications to wake, reconnecting on failure.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.WarnContext(ctx, "outbox relay lost its LISTEN connection; polling until it is back",
			slog.Any("error", err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	pooled, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Take the connection out of the pool: its LISTEN must not leak to other users.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// claimBatch takes the next due rows of the owned partitions in id order.
// A row waits while an earlier row of its aggregate is dead or backing off,
// so a retry never lets a later event overtake. FOR UPDATE without SKIP
// LOCKED: rows another relay still holds (a handover) are waited for, not
// skipped, so they cannot be overtaken either.
const claimBatch = `
SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version,
       o.event_type, o.event_version, o.payload, o.headers, o.occurred_at, o.created_at, o.attempts
FROM outbox_events o
WHERE o.state = 'pending' AND o.next_attempt_at <= now() AND o.partition = ANY($2)
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events e
      WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id
        AND (e.state = 'dead' OR (e.state = 'pending' AND e.next_attempt_at > '-infinity'))
        AND (e.state = 'dead' OR e.next_attempt_at > now()))
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o`

const markPublished = `
UPDATE outbox_events
SET state = 'published', published_at = now(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY($1)`

const markFailed = `
UPDATE outbox_events
SET attempts = attempts + 1,
    last_error = $2,
    next_attempt_at = now() + $3 * interval '1 microsecond',
    state = CASE WHEN attempts + 1 >= $4 THEN 'dead' ELSE 'pending' END
WHERE id = $1
RETURNING state`

type claimed struct {
	id        int64
	attempts  int
	createdAt time.Time
	aggregate string // type + id
	msg       kafka.Message
}

// RelayBatch claims, publishes and marks one batch of the owned partitions,
// returning how many rows it claimed. Run calls it in a loop; it is exported
// for tests and tools, and called outside Run it first takes this relay's
// share of the partitions. It must not be called concurrently with Run.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	if r.owner.conn == nil {
		r.rebalance(ctx)
	}
	owned := r.owner.partitions()
	if len(owned) == 0 {
		return 0, nil
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("beginning claim: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	// The relay's own commit need not wait for the disk: a mark lost in a
	// crash only republishes the batch, which consumers absorb (BENCHMARKS.md).
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d; SET LOCAL synchronous_commit = off",
		r.cfg.LockTimeout.Milliseconds())); err != nil {
		return 0, fmt.Errorf("setting lock timeout: %w", err)
	}
	batch, err := r.claim(ctx, tx, owned)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	r.cfg.Metrics.batchSize.Observe(float64(len(batch)))
	errs := r.publish(ctx, batch)
	if ctx.Err() != nil {
		return 0, ctx.Err() // leave the rows pending; the next run republishes them
	}
	if r.cfg.CrashPoint != nil {
		if err := r.cfg.CrashPoint(CrashAfterAck); err != nil {
			return 0, fmt.Errorf("crash point %s: %w", CrashAfterAck, err)
		}
	}
	var published []int64
	failedAggregates := map[string]bool{}
	now := time.Now()
	for i, c := range batch {
		cause := errs[i]
		if cause == nil && failedAggregates[c.aggregate] {
			// An earlier event of this aggregate failed: retry this one after
			// it, even though the broker took it, so the retry keeps order.
			// Consumers absorb the duplicate.
			cause = errors.New("an earlier event of the same aggregate failed in this batch")
		}
		if cause == nil {
			published = append(published, c.id)
			r.cfg.Metrics.publishLag.Observe(now.Sub(c.createdAt).Seconds())
			if c.attempts > 0 {
				r.cfg.Metrics.retries.Inc()
			}
			continue
		}
		failedAggregates[c.aggregate] = true
		if err := r.fail(ctx, tx, c, cause); err != nil {
			return 0, err
		}
	}
	if len(published) > 0 {
		if _, err := tx.Exec(ctx, markPublished, published); err != nil {
			return 0, fmt.Errorf("marking published: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("committing batch: %w", err)
	}
	r.cfg.Metrics.published.Add(float64(len(published)))
	return len(batch), nil
}

// publish writes the batch and returns one error per row (nil: acked).
// Each topic is written separately and concurrently: kafka-go fails a whole
// write when one of its topics is unknown, and one misrouted aggregate type
// must not hold up the others.
func (r *Relay) publish(ctx context.Context, batch []claimed) []error {
	byTopic := map[string][]int{}
	for i, c := range batch {
		byTopic[c.msg.Topic] = append(byTopic[c.msg.Topic], i)
	}
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for _, idx := range byTopic {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]kafka.Message, len(idx))
			for j, i := range idx {
				msgs[j] = batch[i].msg
			}
			for j, err := range perMessage(r.writer.WriteMessages(ctx, msgs...), len(idx)) {
				errs[idx[j]] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

// perMessage spreads a write error over the messages: kafka-go reports
// either one error per message (kafka.WriteErrors) or one for the write.
func perMessage(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) && len(we) == n {
		return we
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

func (r *Relay) claim(ctx context.Context, tx pgx.Tx, owned []int32) ([]claimed, error) {
	rows, err := tx.Query(ctx, claimBatch, r.cfg.BatchSize, owned)
	if err != nil {
		return nil, fmt.Errorf("claiming batch: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var (
			c       claimed
			ev      event.Envelope
			headers []byte
		)
		err := row.Scan(&c.id, &ev.EventID, &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion,
			&ev.EventType, &ev.EventVersion, &ev.Payload, &headers, &ev.OccurredAt, &c.createdAt, &c.attempts)
		if err != nil {
			return c, err
		}
		var h envelopeHeaders
		if err := json.Unmarshal(headers, &h); err != nil {
			return c, fmt.Errorf("event %s: decoding headers: %w", ev.EventID, err)
		}
		ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		c.aggregate = ev.AggregateType + "\x00" + ev.AggregateID
		c.msg = event.ToKafka(r.cfg.Topic(ev.AggregateType), ev)
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading claimed rows: %w", err)
	}
	return batch, nil
}

func (r *Relay) fail(ctx context.Context, tx pgx.Tx, c claimed, cause error) error {
	r.cfg.Metrics.failures.Inc()
	delay := retry.Backoff(c.attempts+1, r.cfg.BackoffMin, r.cfg.BackoffMax)
	var state string
	err := tx.QueryRow(ctx, markFailed, c.id, cause.Error(), delay.Microseconds(), r.cfg.MaxAttempts).Scan(&state)
	if err != nil {
		return fmt.Errorf("recording failed publish: %w", err)
	}
	log := r.cfg.Logger.With(slog.Int64("outbox_id", c.id), slog.String("topic", c.msg.Topic),
		slog.Int("attempt", c.attempts+1), slog.Any("error", cause))
	if state == "dead" {
		r.cfg.Metrics.deadTotal.Inc()
		log.ErrorContext(ctx, "outbox event is dead after its last attempt; its aggregate's later events wait until it is requeued")
		return nil
	}
	log.WarnContext(ctx, "outbox publish failed; will retry", slog.Duration("retry_in", delay))
	return nil
}
