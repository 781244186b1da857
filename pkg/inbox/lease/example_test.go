package lease_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Lease mode, for a side effect outside the database that cannot be made
// idempotent (a call to a third party): the event id travels as the
// idempotency key, and a delivery whose predecessor may have called asks the
// other side first. A redelivery of a settled event is a duplicate and calls
// nothing. Run(ctx) feeds the consumer from Kafka; Handle feeds it here.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()

	var mu sync.Mutex
	thirdParty := map[string]bool{} // the idempotency keys it has seen
	eff := lease.Effect{
		Check: func(_ context.Context, key string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return thirdParty[key], nil
		},
		Call: func(_ context.Context, _ event.Envelope, key string) error {
			mu.Lock()
			defer mu.Unlock()
			thirdParty[key] = true
			return nil
		},
	}
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-group"}
	c, err := lease.NewConsumer(pool, src, w, eff, lease.Config{Config: inbox.Config{Name: "shim"}, LeaseTTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	ev := exampleEvent("order-1")
	fmt.Println(c.Handle(ctx, event.ToKafka(topic, ev)))
	fmt.Println(c.Handle(ctx, event.ToKafka(topic, ev))) // redelivered
	fmt.Println("calls:", len(thirdParty))
	// Output:
	// <nil>
	// <nil>
	// calls: 1
}

// exampleSetup makes a fresh database with a charges table and the inbox
// schema, and a fresh topic with its dead-letter topic, on the dev stack.
func exampleSetup(ctx context.Context) (*pgxpool.Pool, []string, string, func()) {
	return testenv.ForExample(ctx, `CREATE TABLE charges (order_id text PRIMARY KEY)`,
		[]testenv.Migration{{FS: inbox.Migrations, Table: inbox.MigrationsTable}}, ".dlt")
}

func exampleEvent(orderID string) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "PaymentCaptured", EventVersion: 1, AggregateType: "payment",
		AggregateID: orderID, AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
	}
}
