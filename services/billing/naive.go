package billing

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/crashpoint"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// Reader is the part of a consumer-group *kafka.Reader the naive consumer
// uses (kafkautil.NewGroupReader builds one).
type Reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// NaiveConsumer consumes without the inbox (INBOX_MODE=naive), for the
// fault-injection harness only: fetch, run the handler in a transaction,
// commit, commit the offset. Nothing remembers which events were applied, so
// every redelivery (a crash before the offset commit, a relay republishing
// after its own crash, a replay) applies the event again. It passes the same
// crash point as the inbox (crashpoint.InboxAfterCommit), so the harness can kill
// both at the same moment and compare.
type NaiveConsumer struct {
	Pool   *pgxpool.Pool
	Reader Reader
	Handle inbox.Handler
	// CrashPoint, when set, is called with crashpoint.InboxAfterCommit after each
	// database commit, before the offset commit.
	CrashPoint func(name string) error
	Logger     *slog.Logger
}

// The naive consumer's wait between failed fetches, as the inbox's outage
// backoff: capped, so it is back soon after Kafka is.
const (
	naiveBackoffMin = 100 * time.Millisecond
	naiveBackoffMax = 5 * time.Second
)

// Run consumes until ctx ends, then returns nil. A message that fails is
// logged and skipped: the naive consumer has nowhere to put it. A failed
// fetch is retried with capped backoff and a failed offset commit is logged
// and left to the next one, so that Kafka being away never ends the process:
// the proofs count process exits, and the naive consumer must differ from the
// inbox in what it applies twice, not in whether it survives an outage.
func (c *NaiveConsumer) Run(ctx context.Context) error {
	failures := 0
	for {
		m, err := c.Reader.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			failures++
			c.Logger.WarnContext(ctx, "naive consumer could not fetch; retrying",
				slog.Int("failures", failures), slog.Any("error", err))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(naiveBackoff(failures)):
			}
			continue
		}
		failures = 0
		ev, err := event.FromKafka(m)
		if err == nil {
			err = pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error { return c.Handle(ctx, tx, ev) })
		}
		if err != nil {
			c.Logger.ErrorContext(ctx, "naive consumer skips a message it could not handle",
				slog.String("topic", m.Topic), slog.Int("partition", m.Partition), slog.Int64("offset", m.Offset),
				slog.Any("error", err))
		}
		if c.CrashPoint != nil {
			if err := c.CrashPoint(crashpoint.InboxAfterCommit); err != nil {
				return fmt.Errorf("crash point %s: %w", crashpoint.InboxAfterCommit, err)
			}
		}
		if err := c.Reader.CommitMessages(ctx, m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// A later commit covers this offset; a rebalance first
			// redelivers it, which the naive consumer applies again.
			c.Logger.WarnContext(ctx, "naive consumer could not commit an offset; moving on",
				slog.String("topic", m.Topic), slog.Int("partition", m.Partition), slog.Int64("offset", m.Offset),
				slog.Any("error", err))
		}
	}
}

// naiveBackoff doubles from naiveBackoffMin up to naiveBackoffMax. The naive
// consumer keeps its own: the libraries' backoff is internal to them, and
// this consumer exists only to show what the inbox prevents.
func naiveBackoff(failures int) time.Duration {
	d := naiveBackoffMin
	for i := 1; i < failures && d < naiveBackoffMax; i++ {
		d *= 2
	}
	return min(d, naiveBackoffMax)
}
