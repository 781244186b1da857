package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
)

// Writer is the part of *kafka.Writer the relay needs. It must wait for the
// broker's acknowledgement (RequiredAcks = RequireAll) before returning.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// RelayConfig configures a Relay. Zero fields take the documented defaults.
type RelayConfig struct {
	// Topic maps an aggregate type to its Kafka topic.
	// Default: aggregateType + ".events".
	Topic func(aggregateType string) string
	// BatchSize is the most rows claimed and published at once. Default 500.
	BatchSize int
	// PollInterval is how often the relay looks for work when no commit
	// notification arrives (the fallback if NOTIFY is lost). Default 1s.
	PollInterval time.Duration
	// MaxAttempts is how many failed publishes make a row dead. Default 10.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential, jittered delay before
	// a failed row is retried. Defaults 100ms and 1m.
	BackoffMin, BackoffMax time.Duration
	// Logger receives failures and dead rows. Default: slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics. Default: none registered.
	Registerer prometheus.Registerer
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.Topic == nil {
		c.Topic = func(t string) string { return t + ".events" }
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
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
	return c
}

// Relay publishes pending outbox rows to Kafka and marks them published only
// after the broker acknowledged them. A crash between the two republishes the
// rows (consumers dedupe by event id); no committed event is lost.
//
// One relay per database keeps every aggregate's events in order: rows are
// claimed and published in id order, and each aggregate's rows share a Kafka
// partition (the key is the aggregate id).
type Relay struct {
	pool    *pgxpool.Pool
	writer  Writer
	cfg     RelayConfig
	metrics relayMetrics
}

type relayMetrics struct {
	published prometheus.Counter
	failures  prometheus.Counter
	dead      prometheus.Counter
}

// NewRelay returns a relay reading the outbox in pool and writing to w.
func NewRelay(pool *pgxpool.Pool, w Writer, cfg RelayConfig) (*Relay, error) {
	if pool == nil || w == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a writer")
	}
	r := &Relay{pool: pool, writer: w, cfg: cfg.withDefaults()}
	r.metrics = relayMetrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_published_total", Help: "Outbox events the broker acknowledged.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_publish_failures_total", Help: "Outbox events whose publish attempt failed.",
		}),
		dead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_dead_total", Help: "Outbox events that exhausted their attempts and went dead.",
		}),
	}
	if reg := r.cfg.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{r.metrics.published, r.metrics.failures, r.metrics.dead} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("outbox: registering metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run relays until ctx ends. It wakes on every commit that wrote outbox rows
// (LISTEN/NOTIFY) and, as a fallback, every PollInterval.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	listening := make(chan struct{})
	go func() { defer close(listening); r.listen(ctx, wake) }()
	defer func() { <-listening }()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-timer.C:
		}
		for {
			n, err := r.RelayBatch(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				r.cfg.Logger.ErrorContext(ctx, "outbox relay batch failed", slog.Any("error", err))
				break
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
		timer.Reset(r.cfg.PollInterval)
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
	if _, err := conn.Exec(ctx, "LISTEN outbox_events"); err != nil {
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

const claimBatch = `
SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version,
       event_type, event_version, payload, headers, occurred_at, attempts
FROM outbox_events
WHERE state = 'pending' AND next_attempt_at <= now()
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`

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
	id       int64
	attempts int
	msg      kafka.Message
}

// RelayBatch claims, publishes and marks one batch, returning how many rows
// it claimed. Run calls it in a loop; it is exported for tests and tools.
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("beginning claim: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit

	batch, err := r.claim(ctx, tx)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	msgs := make([]kafka.Message, len(batch))
	for i, c := range batch {
		msgs[i] = c.msg
	}
	writeErr := r.writer.WriteMessages(ctx, msgs...)
	if ctx.Err() != nil {
		return 0, ctx.Err() // leave the rows pending; the next run republishes them
	}
	var perMessage kafka.WriteErrors
	if writeErr != nil && !errors.As(writeErr, &perMessage) {
		perMessage = make(kafka.WriteErrors, len(batch))
		for i := range perMessage {
			perMessage[i] = writeErr
		}
	}
	var published []int64
	for i, c := range batch {
		if perMessage == nil || perMessage[i] == nil {
			published = append(published, c.id)
			continue
		}
		if err := r.fail(ctx, tx, c, perMessage[i]); err != nil {
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
	r.metrics.published.Add(float64(len(published)))
	return len(batch), nil
}

func (r *Relay) claim(ctx context.Context, tx pgx.Tx) ([]claimed, error) {
	rows, err := tx.Query(ctx, claimBatch, r.cfg.BatchSize)
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
			&ev.EventType, &ev.EventVersion, &ev.Payload, &headers, &ev.OccurredAt, &c.attempts)
		if err != nil {
			return c, err
		}
		var h envelopeHeaders
		if err := json.Unmarshal(headers, &h); err != nil {
			return c, fmt.Errorf("event %s: decoding headers: %w", ev.EventID, err)
		}
		ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		c.msg = event.ToKafka(r.cfg.Topic(ev.AggregateType), ev)
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading claimed rows: %w", err)
	}
	return batch, nil
}

func (r *Relay) fail(ctx context.Context, tx pgx.Tx, c claimed, cause error) error {
	r.metrics.failures.Inc()
	delay := retry.Backoff(c.attempts+1, r.cfg.BackoffMin, r.cfg.BackoffMax)
	var state string
	err := tx.QueryRow(ctx, markFailed, c.id, cause.Error(), delay.Microseconds(), r.cfg.MaxAttempts).Scan(&state)
	if err != nil {
		return fmt.Errorf("recording failed publish: %w", err)
	}
	log := r.cfg.Logger.With(slog.Int64("outbox_id", c.id), slog.String("topic", c.msg.Topic),
		slog.Int("attempt", c.attempts+1), slog.Any("error", cause))
	if state == "dead" {
		r.metrics.dead.Inc()
		log.ErrorContext(ctx, "outbox event is dead after its last attempt; requeue it once the cause is fixed")
		return nil
	}
	log.WarnContext(ctx, "outbox publish failed; will retry", slog.Duration("retry_in", delay))
	return nil
}
