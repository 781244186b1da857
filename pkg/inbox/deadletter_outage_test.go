package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// switchWriter forwards to whichever writer is current, so a test can take
// the dead-letter topic's Kafka away from a consumer and give it back.
type switchWriter struct {
	current atomic.Pointer[testenv.Writer]
}

func (s *switchWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	return s.current.Load().WriteMessages(ctx, msgs...)
}

// A dead letter that cannot reach Kafka is waited for outside any
// transaction: in transactional mode the batch it came in commits first, so
// the rows its batch-mates' handlers locked are free; in either mode no
// connection sits idle in a transaction through the outage. Once Kafka is
// back the dead letter is published, once, and the partition moves on.
func TestADeadLetterWaitingForKafkaHoldsNoTransactionOpen(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"transactional", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testDeadLetterWaitingForKafka(t, mode)
		})
	}
}

func testDeadLetterWaitingForKafka(t *testing.T, mode string) {
	ctx := context.Background()
	f := newFixture(t)
	if _, err := f.Pool.Exec(ctx, `CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO counters VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	down := testenv.NewWriter([]string{testenv.ClosedAddr(t)}, 10)
	t.Cleanup(func() { down.Close() })
	dlq := &switchWriter{}
	dlq.current.Store(down)

	good, bad, after := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("b", 1), inboxtesting.NewEvent("c", 1)
	// One write, one worker: good and bad arrive in one batch.
	f.Produce(t, event.ToKafka(f.Topic, good), event.ToKafka(f.Topic, bad))
	cfg := inbox.Config{Name: "test-consumer", Workers: 1, DeadLetterTopic: dlt, Metrics: inbox.NewMetrics(f.Registry),
		BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
	// The effect locks a row that others use too, in the inbox transaction
	// (transactional mode) or on its own (lease mode).
	effect := func(ctx context.Context, exec func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error), ev event.Envelope) error {
		if ev.EventID == bad.EventID {
			return inbox.Permanent(errors.New("refused"))
		}
		if _, err := exec(ctx, "UPDATE counters SET n = n + 1 WHERE id = 1"); err != nil {
			return err
		}
		return insertEffect(ctx, exec, ev)
	}
	src := f.Source(testenv.Name("group"))
	var c *inbox.Consumer
	var err error
	if mode == "transactional" {
		c, err = inbox.NewConsumer(f.Pool, src, dlq, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			return effect(ctx, tx.Exec, ev)
		}, cfg)
	} else {
		c, err = lease.NewConsumer(f.Pool, src, dlq, lease.Effect{
			Check: func(context.Context, string) (bool, error) { return false, nil },
			Call:  func(ctx context.Context, ev event.Envelope, _ string) error { return effect(ctx, f.Pool.Exec, ev) },
		}, lease.Config{Config: cfg})
	}
	if err != nil {
		t.Fatal(err)
	}
	running := inboxtesting.RunUntilCleanup(t, c)

	testenv.WaitFor(t, 30*time.Second, "the dead letter to fail against the missing Kafka", func() (bool, error) {
		return testenv.LabeledMetricValue(t, f.Registry, "inbox_kafka_errors_total", map[string]string{"op": "dead_letter"}) >= 2, running()
	})
	// Another writer of the counter must not wait for the outage.
	err = pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '3s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE counters SET n = n + 100 WHERE id = 1")
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		t.Fatal("a row locked by the dead letter's batch-mate stays locked while the dead letter waits for Kafka")
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := f.Count(t, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Fatalf("%d connections idle in a transaction while the dead letter waits for Kafka, want 0", n)
	}
	// The batch-mate is not held back by the outage. In transactional mode
	// it committed before the dead letter was tried; in lease mode its
	// effect runs in its own key's turn, beside the dead letter's, and may
	// come after the dead letter's first failures: wait for it, with the
	// dead-letter topic still out of reach.
	if mode == "transactional" {
		if n := f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", good.EventID); n != 1 {
			t.Fatal("the dead letter's batch-mate is not committed while the dead letter waits for Kafka")
		}
	} else {
		testenv.WaitFor(t, 30*time.Second, "the dead letter's batch-mate's effect while the dead letter waits for Kafka", func() (bool, error) {
			return f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", good.EventID) == 1, running()
		})
	}

	// Kafka is back: the dead letter goes out once and the partition moves on.
	dlq.current.Store(f.Writer)
	f.Produce(t, event.ToKafka(f.Topic, after))
	testenv.WaitFor(t, 30*time.Second, "the event after the dead letter to be handled", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", after.EventID) == 1, running()
	})
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'dead_lettered' AND message_id = $1", bad.EventID); n != 1 {
		t.Fatalf("%d dead_lettered inbox rows for the refused event, want 1", n)
	}
	if got := deadLettersOn(t, f.Brokers, dlt); got != 1 {
		t.Fatalf("%d messages on the dead-letter topic, want 1", got)
	}
}

// deadLettersOn is how many messages topic's partition 0 holds.
func deadLettersOn(t *testing.T, brokers []string, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		t.Fatal(err)
	}
	return last - first
}

// A consumer stopped while a dead letter waits for Kafka (its batch-mates
// committed, the dead letter neither published nor recorded) loses nothing:
// the message's offset was not committed, so the next consumer of the group
// gets it again and dead-letters it once Kafka is back.
func TestADeadLetterPendingAtShutdownIsPublishedAfterRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	down := testenv.NewWriter([]string{testenv.ClosedAddr(t)}, 10)
	t.Cleanup(func() { down.Close() })

	good, bad := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("b", 1)
	f.Produce(t, event.ToKafka(f.Topic, good), event.ToKafka(f.Topic, bad))
	group := testenv.Name("group")
	consumer := func(dlq inbox.Writer, reg *prometheus.Registry) *inbox.Consumer {
		c, err := inbox.NewConsumer(f.Pool, f.Source(group), dlq, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if ev.EventID == bad.EventID {
				return inbox.Permanent(errors.New("refused"))
			}
			return f.recordEffect(ctx, tx, ev)
		}, inbox.Config{Name: "test-consumer", Workers: 1, DeadLetterTopic: dlt, Metrics: inbox.NewMetrics(reg),
			BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, ShutdownGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	reg := prometheus.NewRegistry()
	first := consumer(down, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	testenv.WaitFor(t, 30*time.Second, "the dead letter to fail against the missing Kafka", func() (bool, error) {
		return testenv.LabeledMetricValue(t, reg, "inbox_kafka_errors_total", map[string]string{"op": "dead_letter"}) >= 2, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("first consumer: %v", err)
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE message_id = $1", bad.EventID); n != 0 {
		t.Fatalf("%d inbox rows for the dead letter that was never published, want 0: a redelivery would skip it as a duplicate", n)
	}

	inboxtesting.RunUntilCleanup(t, consumer(f.Writer, prometheus.NewRegistry()))
	testenv.WaitFor(t, 30*time.Second, "the restarted consumer to dead-letter the event", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'dead_lettered' AND message_id = $1", bad.EventID) == 1, nil
	})
	if got := deadLettersOn(t, f.Brokers, dlt); got != 1 {
		t.Fatalf("%d messages on the dead-letter topic, want 1", got)
	}
	if n := f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", good.EventID); n != 1 {
		t.Fatalf("%d effects of the batch-mate, want 1", n)
	}
}
