package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// run starts a consumer with handler h until the test ends.
func (f *fixture) run(t *testing.T, h inbox.Handler, cfg inbox.Config) {
	t.Helper()
	cfg.Name = "test-consumer"
	cfg.Metrics = inbox.NewMetrics(f.Registry)
	c, err := inbox.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.RunUntilCleanup(t, c)
}

// inBothModes runs test as two parallel subtests, "transactional" and
// "lease", each with a fixture of its own.
func inBothModes(t *testing.T, test func(t *testing.T, f *fixture, mode string)) {
	t.Helper()
	for _, mode := range []string{"transactional", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			test(t, newFixture(t), mode)
		})
	}
}

// modeConsumer is a consumer of the fixture's topic, read through pool in
// group, in mode "transactional" (apply runs in the inbox transaction) or
// "lease" (apply runs on f.Pool beside it, the effect's Check finding
// nothing): the tests that must hold in both modes build theirs here.
func (f *fixture) modeConsumer(t *testing.T, mode string, pool *pgxpool.Pool, group string, apply execApply, cfg inbox.Config) *inbox.Consumer {
	t.Helper()
	var c *inbox.Consumer
	var err error
	if mode == "transactional" {
		c, err = inbox.NewConsumer(pool, f.Source(group), f.Writer, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			return apply(ctx, tx.Exec, ev)
		}, cfg)
	} else {
		c, err = lease.NewConsumer(pool, f.Source(group), f.Writer, lease.Effect{
			Check: func(context.Context, string) (bool, error) { return false, nil },
			Call: func(ctx context.Context, ev event.Envelope, _ string) error {
				return apply(ctx, f.Pool.Exec, ev)
			},
		}, lease.Config{Config: cfg})
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// execApply is a side effect written through exec: a transaction's or a
// pool's Exec.
type execApply func(ctx context.Context, exec func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error), ev event.Envelope) error

// insertEffect is the plain side effect: one effects row per event.
func insertEffect(ctx context.Context, exec func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error), ev event.Envelope) error {
	_, err := exec(ctx, "INSERT INTO effects (event_id, aggregate_id) VALUES ($1, $2)", ev.EventID, ev.AggregateID)
	return err
}

// recordEffect is a handler whose side effect is one row per event.
func (f *fixture) recordEffect(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	f.Calls.Add(1)
	_, err := tx.Exec(ctx, "INSERT INTO effects (event_id, aggregate_id) VALUES ($1, $2)", ev.EventID, ev.AggregateID)
	return err
}

func TestSameEventTenTimesHasOneEffect(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ev := inboxtesting.NewEvent("agg", 1)
	msgs := make([]kafka.Message, 10)
	for i := range msgs {
		msgs[i] = event.ToKafka(f.Topic, ev)
	}
	f.Produce(t, msgs...)
	f.run(t, f.recordEffect, inbox.Config{})

	testenv.WaitFor(t, 30*time.Second, "10 deliveries to be handled", func() (bool, error) {
		return testenv.MetricValue(t, f.Registry, "inbox_processed_total")+
			testenv.MetricValue(t, f.Registry, "inbox_duplicates_total") == 10, nil
	})
	if n := f.Count(t, "SELECT count(*) FROM effects"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"); n != 1 {
		t.Fatalf("%d inbox rows, want 1", n)
	}
	if got := testenv.MetricValue(t, f.Registry, "inbox_duplicates_total"); got != 9 {
		t.Fatalf("inbox_duplicates_total = %v, want 9", got)
	}
	if got := f.Calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

func TestPoisonMessagesAreDeadLetteredAndThePartitionMovesOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	// The good event is of another aggregate: a later event of the bad
	// one's aggregate would be parked behind it (park_test.go).
	good := inboxtesting.NewEvent("other", 1)
	badVersion := inboxtesting.NewEvent("agg", 1)
	badVersion.EventVersion = 99
	f.Produce(t,
		kafka.Message{Key: []byte("agg"), Value: []byte("not an event")},
		event.ToKafka(f.Topic, badVersion),
		event.ToKafka(f.Topic, good),
	)
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		if ev.EventVersion != 1 {
			return inbox.Permanent(fmt.Errorf("unknown %s version %d", ev.EventType, ev.EventVersion))
		}
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{DeadLetterTopic: dlt})

	testenv.WaitFor(t, 30*time.Second, "the good event behind two poison messages", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", good.EventID) == 1, nil
	})

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: f.Brokers, Topic: dlt, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wantReasons := []string{"event-id", "unknown ThingHappened version 99"}
	for i, want := range wantReasons {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("reading dead letter %d: %v", i, err)
		}
		h := map[string]string{}
		for _, kv := range m.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if !strings.Contains(h[inboxadmin.HeaderDLTReason], want) {
			t.Fatalf("dead letter %d reason = %q, want it to mention %q", i, h[inboxadmin.HeaderDLTReason], want)
		}
		if h[inboxadmin.HeaderDLTTopic] != f.Topic || h[inboxadmin.HeaderDLTOffset] != fmt.Sprint(i) {
			t.Fatalf("dead letter %d came from %s@%s, want %s@%d", i, h[inboxadmin.HeaderDLTTopic], h[inboxadmin.HeaderDLTOffset], f.Topic, i)
		}
	}
	// The dead letter is published first, its row recorded after, in a
	// transaction of its own (deadLetterAlone): reading the topic does not
	// mean the row is there yet, nor the count.
	testenv.WaitFor(t, 10*time.Second, "the unknown version's dead_lettered inbox row and both dead letters counted", func() (bool, error) {
		n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'dead_lettered' AND message_id = $1", badVersion.EventID)
		if n > 1 {
			return false, fmt.Errorf("%d dead_lettered inbox rows for the unknown version, want 1", n)
		}
		return n == 1 && testenv.MetricValue(t, f.Registry, "inbox_dead_lettered_total") == 2, nil
	})
	for reason, want := range map[string]float64{"undecodable": 1, "permanent": 1, "exhausted": 0} {
		if got := testenv.LabeledMetricValue(t, f.Registry, "inbox_dead_lettered_total", map[string]string{"reason": reason}); got != want {
			t.Errorf("inbox_dead_lettered_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

func TestTransientFailuresRetryThenSucceedOrDeadLetter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	flaky, hopeless := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("b", 1)
	f.Produce(t, event.ToKafka(f.Topic, flaky), event.ToKafka(f.Topic, hopeless))
	var flakyTries atomic.Int32
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		if ev.EventID == hopeless.EventID {
			return errors.New("downstream down")
		}
		if flakyTries.Add(1) < 3 {
			return errors.New("deadlock, try again")
		}
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{DeadLetterTopic: dlt, MaxAttempts: 4, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		LagInterval: 50 * time.Millisecond})

	testenv.WaitFor(t, 30*time.Second, "the hopeless event to be dead-lettered", func() (bool, error) {
		return testenv.LabeledMetricValue(t, f.Registry, "inbox_dead_lettered_total",
			map[string]string{"reason": "exhausted"}) == 1, nil
	})
	// The dead-letter backlog: the hopeless event's row, until a requeue.
	testenv.WaitFor(t, 10*time.Second, "inbox_dead_letters to count the dead-lettered row", func() (bool, error) {
		return testenv.MetricValue(t, f.Registry, "inbox_dead_letters") == 1, nil
	})
	// The two events' keys may go to different workers: the hopeless one's
	// dead letter says nothing about where the flaky one's retries are.
	testenv.WaitFor(t, 10*time.Second, "the flaky event's effect after its retries", func() (bool, error) {
		n := f.Count(t, "SELECT count(*) FROM effects WHERE event_id = $1", flaky.EventID)
		if n > 1 {
			return false, fmt.Errorf("flaky event: %d effects, want 1 after retries", n)
		}
		return n == 1, nil
	})
	if got := flakyTries.Load(); got != 3 {
		t.Fatalf("flaky event tried %d times, want 3", got)
	}
	var lastErr string
	if err := f.Pool.QueryRow(context.Background(),
		"SELECT last_error FROM inbox_messages WHERE message_id = $1 AND status = 'dead_lettered'", hopeless.EventID).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "gave up after 4 attempts: downstream down") {
		t.Fatalf("last_error = %q", lastErr)
	}
	// 2 failures of the flaky event + 4 of the hopeless one.
	if got := testenv.MetricValue(t, f.Registry, "inbox_failures_total"); got != 6 {
		t.Fatalf("inbox_failures_total = %v, want 6", got)
	}
}
