package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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
