package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/event/retry"
)

// Handler applies one event's side effects using tx, the transaction the
// inbox row is written in. It must not commit or roll back tx. An error
// wrapping ErrPermanent or event.ErrInvalid dead-letters the event at once;
// any other error is retried.
type Handler func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// ErrPermanent marks a handler error that no retry can fix.
var ErrPermanent = errors.New("permanent failure")

// Permanent wraps err so the consumer dead-letters instead of retrying.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// Reader is the part of *kafka.Reader (in a consumer group) the consumer needs.
type Reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Writer publishes dead letters; *kafka.Writer satisfies it.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Config configures a Consumer. Zero fields take the documented defaults.
type Config struct {
	// Name identifies the consumer; dedupe is per (Name, event id). Required.
	Name string
	// DeadLetterTopic receives messages that cannot be handled.
	// Default: the message's topic + ".dlt".
	DeadLetterTopic string
	// MaxAttempts bounds how often a failing handler runs for one message
	// before it is dead-lettered. Default 5.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the jittered exponential delay between
	// attempts. Defaults 50ms and 5s.
	BackoffMin, BackoffMax time.Duration
	// Logger receives failures and dead letters. Default: slog.Default().
	Logger *slog.Logger
	// Registerer receives the consumer's metrics, labelled with Name.
	// Default: none registered.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 50 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Consumer handles the messages of one reader through the inbox.
type Consumer struct {
	pool    *pgxpool.Pool
	reader  Reader
	dlq     Writer
	handle  Handler
	cfg     Config
	metrics metrics
}

type metrics struct {
	processed, duplicates, failures, deadLettered prometheus.Counter
	seconds                                       prometheus.Histogram
}

// NewConsumer returns a consumer that reads from r, handles each event with h
// in a transaction on pool, and dead-letters through dlq.
func NewConsumer(pool *pgxpool.Pool, r Reader, dlq Writer, h Handler, cfg Config) (*Consumer, error) {
	if pool == nil || r == nil || dlq == nil || h == nil {
		return nil, errors.New("inbox: NewConsumer needs a pool, a reader, a dead-letter writer and a handler")
	}
	if cfg.Name == "" {
		return nil, errors.New("inbox: Config.Name is required")
	}
	c := &Consumer{pool: pool, reader: r, dlq: dlq, handle: h, cfg: cfg.withDefaults()}
	labels := prometheus.Labels{"consumer": cfg.Name}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	c.metrics = metrics{
		processed:    counter("inbox_processed_total", "Events handled and committed with their inbox row."),
		duplicates:   counter("inbox_duplicates_total", "Redelivered events acknowledged without running the handler."),
		failures:     counter("inbox_failures_total", "Handler attempts that failed (each retry counts)."),
		deadLettered: counter("inbox_dead_lettered_total", "Messages sent to the dead-letter topic."),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "inbox_processing_seconds", Help: "Time to handle one event, inbox write and commit included.",
			ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	if reg := c.cfg.Registerer; reg != nil {
		m := c.metrics
		for _, col := range []prometheus.Collector{m.processed, m.duplicates, m.failures, m.deadLettered, m.seconds} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("inbox: registering metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Run consumes until ctx ends, finishing the message in hand first.
func (c *Consumer) Run(ctx context.Context) error {
	for {
		m, err := c.reader.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("inbox %s: fetching: %w", c.cfg.Name, err)
		}
		// The message in hand is finished even if ctx ends meanwhile, so a
		// clean shutdown never leaves work half done.
		if err := c.Process(context.WithoutCancel(ctx), m); err != nil {
			return err
		}
	}
}

// Process handles one message through the inbox and then commits its offset.
// It returns an error only when the message could be neither handled nor
// dead-lettered; the offset is then left uncommitted.
func (c *Consumer) Process(ctx context.Context, m kafka.Message) error {
	start := time.Now()
	defer func() { c.metrics.seconds.Observe(time.Since(start).Seconds()) }()

	ev, err := event.FromKafka(m)
	if err != nil {
		if err := c.deadLetter(ctx, m, nil, err); err != nil {
			return err
		}
		return c.commitOffset(ctx, m)
	}
	for attempt := 1; ; attempt++ {
		duplicate, err := c.handleOnce(ctx, m, ev)
		if err == nil {
			if duplicate {
				c.metrics.duplicates.Inc()
				c.cfg.Logger.DebugContext(ctx, "inbox duplicate", slog.String("consumer", c.cfg.Name),
					slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType))
			} else {
				c.metrics.processed.Inc()
			}
			break
		}
		c.metrics.failures.Inc()
		permanent := errors.Is(err, ErrPermanent) || errors.Is(err, event.ErrInvalid)
		if permanent || attempt >= c.cfg.MaxAttempts {
			if !permanent {
				err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
			}
			if err := c.deadLetter(ctx, m, &ev, err); err != nil {
				return err
			}
			break
		}
		delay := retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)
		c.cfg.Logger.WarnContext(ctx, "inbox handler failed; retrying",
			slog.String("consumer", c.cfg.Name), slog.String("event_id", ev.EventID.String()),
			slog.String("event_type", ev.EventType), slog.Int("attempt", attempt),
			slog.Duration("retry_in", delay), slog.Any("error", err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
	return c.commitOffset(ctx, m)
}

const insertProcessed = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, payload_hash, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', $9, now())
ON CONFLICT (consumer, message_id) DO NOTHING`

// handleOnce runs the handler in one transaction with the inbox insert. It
// reports duplicate when the inbox already held the event.
func (c *Consumer) handleOnce(ctx context.Context, m kafka.Message, ev event.Envelope) (duplicate bool, err error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("beginning: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	hash := sha256.Sum256(ev.Payload)
	tag, err := tx.Exec(ctx, insertProcessed, c.cfg.Name, ev.EventID, ev.EventType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, hash[:])
	if err != nil {
		return false, fmt.Errorf("recording in inbox: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return true, tx.Commit(ctx)
	}
	if err := c.handle(ctx, tx, ev); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("committing: %w", err)
	}
	return false, nil
}

const insertDeadLettered = `
INSERT INTO inbox_messages (consumer, message_id, event_type, aggregate_id, aggregate_version,
                            topic, kafka_partition, kafka_offset, status, last_error, payload_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'dead_lettered', $9, $10)
ON CONFLICT (consumer, message_id) DO UPDATE
SET status = 'dead_lettered', last_error = EXCLUDED.last_error, attempts = inbox_messages.attempts + 1`

// Dead-letter headers added to the original message's headers.
const (
	HeaderDLTReason    = "dlt-reason"
	HeaderDLTConsumer  = "dlt-consumer"
	HeaderDLTTopic     = "dlt-original-topic"
	HeaderDLTPartition = "dlt-original-partition"
	HeaderDLTOffset    = "dlt-original-offset"
	HeaderDLTFailedAt  = "dlt-failed-at"
)

// deadLetter publishes m to the dead-letter topic with the reason, then, when
// the envelope decoded, records a dead_lettered inbox row. It retries the
// publish until it succeeds or ctx ends: a message is never dropped.
func (c *Consumer) deadLetter(ctx context.Context, m kafka.Message, ev *event.Envelope, reason error) error {
	topic := c.cfg.DeadLetterTopic
	if topic == "" {
		topic = m.Topic + ".dlt"
	}
	dl := kafka.Message{Topic: topic, Key: m.Key, Value: m.Value}
	dl.Headers = append(append(dl.Headers, m.Headers...),
		kafka.Header{Key: HeaderDLTReason, Value: []byte(reason.Error())},
		kafka.Header{Key: HeaderDLTConsumer, Value: []byte(c.cfg.Name)},
		kafka.Header{Key: HeaderDLTTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: HeaderDLTPartition, Value: []byte(strconv.Itoa(m.Partition))},
		kafka.Header{Key: HeaderDLTOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
		kafka.Header{Key: HeaderDLTFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	for attempt := 1; ; attempt++ {
		err := c.dlq.WriteMessages(ctx, dl)
		if err == nil {
			break
		}
		c.cfg.Logger.ErrorContext(ctx, "inbox could not publish a dead letter; retrying",
			slog.String("consumer", c.cfg.Name), slog.String("topic", topic), slog.Any("error", err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("inbox %s: dead-lettering %s/%d/%d: %w", c.cfg.Name, m.Topic, m.Partition, m.Offset, err)
		case <-time.After(retry.Backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)):
		}
	}
	c.metrics.deadLettered.Inc()
	log := c.cfg.Logger.With(slog.String("consumer", c.cfg.Name), slog.String("topic", m.Topic),
		slog.Int("partition", m.Partition), slog.Int64("offset", m.Offset), slog.String("dead_letter_topic", topic),
		slog.Any("error", reason))
	if ev == nil {
		log.ErrorContext(ctx, "inbox dead-lettered an undecodable message")
		return nil
	}
	log.ErrorContext(ctx, "inbox dead-lettered an event", slog.String("event_id", ev.EventID.String()),
		slog.String("event_type", ev.EventType))
	hash := sha256.Sum256(ev.Payload)
	if _, err := c.pool.Exec(ctx, insertDeadLettered, c.cfg.Name, ev.EventID, ev.EventType, ev.AggregateID,
		ev.AggregateVersion, m.Topic, m.Partition, m.Offset, reason.Error(), hash[:]); err != nil {
		// The dead letter is safely in Kafka; the row is only the local audit.
		log.ErrorContext(ctx, "inbox could not record a dead letter", slog.Any("record_error", err))
	}
	return nil
}

func (c *Consumer) commitOffset(ctx context.Context, m kafka.Message) error {
	if err := c.reader.CommitMessages(ctx, m); err != nil {
		// Not fatal for correctness: the message will be redelivered and
		// absorbed by the inbox. It is fatal for this reader, so stop.
		return fmt.Errorf("inbox %s: committing offset %s/%d/%d: %w", c.cfg.Name, m.Topic, m.Partition, m.Offset, err)
	}
	return nil
}
