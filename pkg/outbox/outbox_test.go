package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestEnqueueCommitsOrRollsBackWithTheBusinessTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newOutboxDB(t)

	// The rollback comes first: it must leave nothing for the commit's
	// count to see.
	for _, step := range []struct {
		end   func(pgx.Tx) error
		name  string
		where string
		want  int
	}{
		{func(tx pgx.Tx) error { return tx.Rollback(ctx) }, "after rollback", "true", 0},
		{func(tx pgx.Tx) error { return tx.Commit(ctx) }, "after commit", "state = 'pending'", 1},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := outbox.Enqueue(ctx, tx, newEvent("a", 1)); err != nil {
			t.Fatal(err)
		}
		if err := step.end(tx); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, pool, step.where); n != step.want {
			t.Fatalf("%s: %d rows where %s, want %d", step.name, n, step.where, step.want)
		}
	}
}

func TestEnqueueRejectsAnIncompleteEnvelope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newOutboxDB(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ev := newEvent("", 1)
	if err := outbox.Enqueue(ctx, tx, ev); !errors.Is(err, event.ErrInvalid) {
		t.Fatalf("err = %v, want event.ErrInvalid for a missing aggregate id", err)
	}
}

func TestRelayPublishesThroughTheBrokerThenMarks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 3)
	pool := newOutboxDB(t)

	var want []event.Envelope
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for v := int64(1); v <= 5; v++ {
		want = append(want, newEvent("agg-1", v))
	}
	if err := outbox.EnqueueBatch(ctx, tx, want...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	w := testenv.NewWriter(brokers, 100)
	defer w.Close()
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{Topic: func(string) string { return topic }})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "Run", relay.Run)

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: testenv.Name("g"), MaxWait: 100 * time.Millisecond})
	defer r.Close()
	for i, w := range want {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("reading event %d: %v", i, err)
		}
		got, err := event.FromKafka(m)
		if err != nil {
			t.Fatalf("decoding event %d: %v", i, err)
		}
		if got.EventID != w.EventID || got.AggregateVersion != w.AggregateVersion || got.CorrelationID != "corr-1" {
			t.Fatalf("event %d = %s v%d, want %s v%d in order", i, got.EventID, got.AggregateVersion, w.EventID, w.AggregateVersion)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "all rows marked published", func() (bool, error) {
		return countRows(t, pool, "state = 'published' AND published_at IS NOT NULL") == len(want), nil
	})
}
