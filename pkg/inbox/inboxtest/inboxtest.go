// Package inboxtest is the inbox's test kit, for the tests of handlers
// (River's rivertest is the model): Deliver runs a handler through the
// consumer's real transaction path — inbox row, version guard, handler,
// retries, dead letters — without Kafka, and the Require helpers assert what
// the inbox recorded without writing SQL against its tables. Lease mode's
// kit, with its third-party stand-ins, is pkg/inbox/lease/leasetest.
package inboxtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Topic is the topic Deliver pretends its events were read from; their dead
// letters go to Topic + ".dlt" unless cfg.DeadLetterTopic says otherwise.
const Topic = "inboxtest.events"

// Deliver hands evs, in order, to a consumer configured by cfg (cfg.Name is
// required; see inbox.Config) that runs h in transactions on pool, exactly
// as a consumer fed by Kafka would (inbox.Consumer.Handle), and returns the
// dead letters it wrote. The same event delivered twice, in one call or two,
// is a duplicate the second time, as it would be from Kafka. Retry backoffs
// default to 1ms–10ms here, so a failing handler is dead-lettered quickly.
// pool must hold the inbox schema. Deliver fails the test if the consumer
// could not settle every event within 30s.
func Deliver(t testing.TB, pool *pgxpool.Pool, cfg inbox.Config, h inbox.Handler, evs ...event.Envelope) []kafka.Message {
	t.Helper()
	return deliver(t, evs, func(dlq *testenv.Recorder) (*inbox.Consumer, error) {
		return inbox.NewConsumer(pool, source(), dlq, h, fast(cfg))
	})
}

// DeliverBatched is Deliver for a consumer whose handler also applies
// batches at once (inbox.NewBatchConsumer): evs go through h.HandleBatch
// in one batch, and through h.Handle one by one when the batch fails.
func DeliverBatched(t testing.TB, pool *pgxpool.Pool, cfg inbox.Config, h inbox.BatchHandler, evs ...event.Envelope) []kafka.Message {
	t.Helper()
	return deliver(t, evs, func(dlq *testenv.Recorder) (*inbox.Consumer, error) {
		return inbox.NewBatchConsumer(pool, source(), dlq, h, fast(cfg))
	})
}

// DeliverWith is Deliver for a consumer that newConsumer builds, from the
// group settings Deliver uses (never dialled: Handle does not read from the
// group) and the dead-letter writer whose letters DeliverWith returns. Lease
// mode's kit (pkg/inbox/lease/leasetest) delivers through it.
func DeliverWith(t testing.TB, newConsumer func(src inbox.GroupConfig, dlq inbox.Writer) (*inbox.Consumer, error), evs ...event.Envelope) []kafka.Message {
	t.Helper()
	return deliver(t, evs, func(dlq *testenv.Recorder) (*inbox.Consumer, error) {
		return newConsumer(source(), dlq)
	})
}

func source() inbox.GroupConfig {
	// Never dialled: Handle does not read from the group.
	return inbox.GroupConfig{Brokers: []string{"inboxtest.invalid:9092"}, Topic: Topic, Group: "inboxtest"}
}

func fast(cfg inbox.Config) inbox.Config {
	if cfg.BackoffMin == 0 && cfg.BackoffMax == 0 {
		cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	return cfg
}

// offsets numbers Deliver's messages across calls, as a partition would.
var offsets struct {
	sync.Mutex
	next int64
}

// deliver hands evs to the consumer newConsumer makes, which writes its dead
// letters to dlq, and returns those dead letters.
func deliver(t testing.TB, evs []event.Envelope, newConsumer func(dlq *testenv.Recorder) (*inbox.Consumer, error)) []kafka.Message {
	t.Helper()
	var dlq testenv.Recorder
	c, err := newConsumer(&dlq)
	if err != nil {
		t.Fatalf("inboxtest: %v", err)
	}
	msgs := make([]kafka.Message, len(evs))
	offsets.Lock()
	for i, ev := range evs {
		msgs[i] = event.ToKafka(Topic, ev)
		msgs[i].Offset = offsets.next
		offsets.next++
	}
	offsets.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Handle(ctx, msgs...); err != nil {
		t.Fatalf("inboxtest: delivering %d events: %v", len(evs), err)
	}
	return dlq.Messages()
}

// DB is what the Require helpers read through: a pgx.Tx, a *pgxpool.Pool
// or a *pgx.Conn.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Status returns the inbox's record of eventID for consumer: "processed",
// "stale" (skipped by the version guard), "dead_lettered", or in lease mode
// "leased", "uncertain"; "" when the inbox has no row for it.
func Status(t testing.TB, db DB, consumer string, eventID uuid.UUID) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var status string
	err := db.QueryRow(ctx, `SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`,
		consumer, [16]byte(eventID)).Scan(&status)
	switch {
	case err == pgx.ErrNoRows:
		return ""
	case err != nil:
		t.Fatalf("inboxtest: reading the inbox: %v", err)
	}
	return status
}

// RequireStatus fails the test unless the inbox of consumer records eventID
// with status (see Status).
func RequireStatus(t testing.TB, db DB, consumer string, eventID uuid.UUID, status string) {
	t.Helper()
	if got := Status(t, db, consumer, eventID); got != status {
		t.Fatalf("inboxtest: event %s of consumer %q is %s, want %s", eventID, consumer, describe(got), status)
	}
}

// RequireProcessed fails the test unless consumer's handler ran for eventID
// and its effects committed.
func RequireProcessed(t testing.TB, db DB, consumer string, eventID uuid.UUID) {
	t.Helper()
	RequireStatus(t, db, consumer, eventID, "processed")
}

// RequireNotReceived fails the test if the inbox of consumer has any record
// of eventID.
func RequireNotReceived(t testing.TB, db DB, consumer string, eventID uuid.UUID) {
	t.Helper()
	if got := Status(t, db, consumer, eventID); got != "" {
		t.Fatalf("inboxtest: event %s of consumer %q is %s, want no record", eventID, consumer, got)
	}
}

// Count returns how many events the inbox of consumer records ("" counts
// every consumer's).
func Count(t testing.TB, db DB, consumer string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM inbox_messages WHERE $1 = '' OR consumer = $1`, consumer).Scan(&n); err != nil {
		t.Fatalf("inboxtest: counting the inbox: %v", err)
	}
	return n
}

func describe(status string) string {
	if status == "" {
		return "not in the inbox"
	}
	return fmt.Sprintf("%q", status)
}
