package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A batch holds v1 and v2 of one key (and v1 of another). v1 fails, and
// while it waits to be retried alone its generation is dropped (a
// rebalance gave the partition away): v1 is abandoned, to be fetched again
// by the partition's next owner. v2 must be abandoned with it: applying it
// would make the redelivered v1 look stale, and v1 would never be applied.
// The other key's message is not held back.
func TestAbandoningAMessageAbandonsTheLaterMessagesOfItsKeyInTheBatch(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	pool := testenv.NewPool(t, testenv.NewMigratedDatabase(t, migrations))
	w := testenv.NewWriter(brokers, 10)
	t.Cleanup(func() { w.Close() })
	topic := testenv.Name("abandon")

	ev := func(key string, v int64) event.Envelope {
		return event.Envelope{EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1,
			AggregateType: "thing", AggregateID: key, AggregateVersion: v, OccurredAt: time.Now(), Payload: []byte(`{}`)}
	}
	v1, v2, other := ev("a", 1), ev("a", 2), ev("b", 1)
	gen := newGeneration(1, map[partitionKey]int64{{topic, 0}: 0})
	var batch []Delivery
	for i, e := range []event.Envelope{v1, v2, other} {
		m := event.ToKafka(topic, e)
		m.Topic, m.Partition, m.Offset = topic, 0, int64(i)
		if !gen.add(m) || !gen.begin() {
			t.Fatal("the generation refused a message")
		}
		batch = append(batch, Delivery{Msg: m, Gen: gen})
	}

	var (
		mu      sync.Mutex
		applied []uuid.UUID
	)
	h := func(_ context.Context, _ pgx.Tx, e event.Envelope) error {
		if e.EventID == v1.EventID {
			gen.drop() // the rebalance, while v1 is being handled
			return errors.New("a transient failure")
		}
		mu.Lock()
		applied = append(applied, e.EventID)
		mu.Unlock()
		return nil
	}
	c, err := NewConsumer(pool, GroupConfig{Brokers: brokers, Topic: topic, Group: "g"}, w, h,
		Config{Name: "abandon", BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.applier.Process(context.Background(), batch); err != nil {
		t.Fatalf("process: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, id := range applied {
		if id == v2.EventID {
			t.Fatal("v2 was applied although v1 of its key was abandoned: the redelivered v1 would be skipped as stale and lost")
		}
	}
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM inbox_messages WHERE message_id = ANY($1)`, []uuid.UUID{v1.EventID, v2.EventID}).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d inbox rows for the abandoned key, want none: its messages are redelivered", n)
	}
	if len(applied) != 1 || applied[0] != other.EventID {
		t.Fatalf("applied %v, want only the other key's message %v: another key is not held back", applied, other.EventID)
	}
}
