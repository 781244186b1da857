package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A domain change and its event commit in one transaction; the relay then
// publishes the event and marks it published.
func Example() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()

	// The business transaction: the order row and its event, together.
	orderID := uuid.New()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2)`, orderID, 1999); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"orderId": orderID, "amountCents": 1999})
		return outbox.Enqueue(ctx, tx, event.Envelope{
			EventID:          uuid.New(),
			EventType:        "OrderPlaced",
			EventVersion:     1,
			AggregateType:    "order",
			AggregateID:      orderID.String(),
			AggregateVersion: 1,
			OccurredAt:       time.Now(),
			Payload:          payload,
		})
	})
	if err != nil {
		fmt.Println("placing the order:", err)
		return
	}

	// The relay: in a service, relay.Run(ctx) runs for the process's life.
	w := testenv.NewWriter(brokers, 500)
	defer w.Close()
	relay, err := outbox.NewRelay(pool, w, outbox.RelayConfig{Topic: func(string) string { return topic }})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan error, 1)
	go func() { stopped <- relay.Run(runCtx) }()

	// A consumer sees the event, keyed by the aggregate id.
	m, err := firstMessage(ctx, brokers, topic)
	if err != nil {
		fmt.Println("reading:", err)
		return
	}
	ev, err := event.FromKafka(m)
	fmt.Println(ev.EventType, string(m.Key) == orderID.String(), err)

	// On shutdown (SIGTERM), ending Run's context stops the relay.
	stop()
	fmt.Println("relay stopped:", <-stopped)
	// Output:
	// OrderPlaced true <nil>
	// relay stopped: <nil>
}

// Operators replay a window of published events; the dry run only lists them.
func ExampleRelayMode_Replay() {
	ctx := context.Background()
	pool, _, _, cleanup := exampleSetup(ctx)
	defer cleanup()
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Enqueue(ctx, tx, event.Envelope{
			EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
			AggregateID: "order-42", AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
		})
	})
	_, _ = pool.Exec(ctx, `UPDATE outbox_events SET state = 'published', published_at = now()`)

	items, err := outbox.ModePoll.Replay(ctx, pool, outbox.ReplayFilter{
		AggregateType: "order", AggregateID: "order-42", From: time.Now().Add(-time.Hour),
	}, true)
	fmt.Println(len(items), items[0].EventType, items[0].AggregateVersion, err)
	// Output: 1 OrderPlaced 1 <nil>
}

// firstMessage reads the first message of the example's one-partition topic,
// as any Kafka consumer would.
func firstMessage(ctx context.Context, brokers []string, topic string) (kafka.Message, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return r.ReadMessage(ctx)
}

// exampleSetup makes a fresh database with an orders table and the outbox
// schema, and a fresh one-partition topic, on the dev stack (`make up`).
func exampleSetup(ctx context.Context) (*pgxpool.Pool, []string, string, func()) {
	return testenv.ForExample(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, amount_cents bigint NOT NULL)`,
		[]testenv.Migration{{FS: outbox.Migrations, Table: outbox.MigrationsTable}})
}
