package inbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func exampleEvent(orderID string) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "PaymentCaptured", EventVersion: 1, AggregateType: "payment",
		AggregateID: orderID, AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
	}
}

// billingConsumer is the consumer the operators' examples act on: billing,
// in the group of the example's topic, handling with h, dead-lettering
// with w; built as ExampleNewConsumer shows.
func billingConsumer(pool *pgxpool.Pool, w *testenv.Writer, brokers []string, topic string, h inbox.Handler) (*inbox.Consumer, error) {
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-group"}
	return inbox.NewConsumer(pool, src, w, h, inbox.Config{Name: "billing"})
}

// Handle runs messages a caller fetched itself through the inbox: the same
// transaction, dedupe, version guard, retries and dead letters as Run, but
// no consumer group and no offsets.
func ExampleConsumer_Handle() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()
	charge := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, ev.AggregateID)
		return err
	}
	w := testenv.NewWriter(brokers, 10)
	defer w.Close()
	src := inbox.GroupConfig{Brokers: brokers, Topic: topic, Group: topic + "-group"}
	c, err := inbox.NewConsumer(pool, src, w, charge, inbox.Config{Name: "billing"})
	if err != nil {
		fmt.Println(err)
		return
	}
	ev := event.ToKafka(topic, exampleEvent("order-1"))
	fmt.Println(c.Handle(ctx, ev, ev, ev))
	var charges int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges)
	fmt.Println("charges:", charges)
	// Output:
	// <nil>
	// charges: 1
}

// Constructors refuse a configuration no consumer can run with; Validate
// says why before anything starts.
func ExampleConfig_Validate() {
	fmt.Println(inbox.Config{Name: "billing", BackoffMin: time.Minute}.Validate())
	fmt.Println(inbox.Config{Name: "billing", Workers: -1}.Validate())
	// Output:
	// inbox: Config.BackoffMin (1m0s) exceeds BackoffMax (5s)
	// inbox: Config.Workers is negative (-1); leave it zero for the default
}
