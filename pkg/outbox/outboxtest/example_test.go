package outboxtest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A test of code that enqueues asserts what it enqueued — here inside the
// transaction, before it commits — without SQL against the outbox table.
func ExampleRequireEnqueued() {
	t := testenv.NewExampleTB()
	defer t.Done()
	ctx := context.Background()
	pool := outboxtest.NewDatabase(t)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := outbox.Enqueue(ctx, tx, orderPlaced("order-1")); err != nil {
			return err
		}
		ev := outboxtest.RequireEnqueued(t, tx, outboxtest.Match{EventType: "OrderPlaced", AggregateID: "order-1"})
		fmt.Println(ev.EventType, ev.AggregateID, ev.State, ev.CorrelationID)
		outboxtest.RequireNotEnqueued(t, tx, outboxtest.Match{EventType: "OrderCancelled"})
		return nil
	})
	fmt.Println("committed:", err)
	// Output:
	// OrderPlaced order-1 pending req-1
	// committed: <nil>
}

// A relay under test publishes to an in-memory Writer instead of Kafka.
func ExampleWriter() {
	t := testenv.NewExampleTB()
	defer t.Done()
	ctx := context.Background()
	pool := outboxtest.NewDatabase(t)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, orderPlaced("order-1")) }); err != nil {
		fmt.Println(err)
		return
	}

	var w outboxtest.Writer
	relay, err := outbox.NewRelay(pool, &w, outbox.RelayConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "the relay to publish", func() (bool, error) {
		return len(outboxtest.Enqueued(t, pool, outboxtest.Match{State: "published"})) == 1, nil
	})
	stop()
	fmt.Println("relay:", <-done)
	for _, m := range w.Messages() {
		fmt.Println(m.Topic, string(m.Key))
	}
	// Output:
	// relay: <nil>
	// order.events order-1
}

func orderPlaced(id string) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: id, AggregateVersion: 1, OccurredAt: time.Now(), CorrelationID: "req-1", Payload: []byte(`{}`),
	}
}
