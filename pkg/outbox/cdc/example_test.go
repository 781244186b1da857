package cdc_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The log-based relay publishes from the replication stream: here an event
// written only to the WAL with Emit (RELAY_MODE=wal); rows written with
// Enqueue (RELAY_MODE=cdc) go the same way.
func ExampleRelay() {
	ctx := context.Background()
	pool, brokers, topic, cleanup := exampleSetup(ctx)
	defer cleanup()

	// The relay creates its slot on its first start; the stream begins there.
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	slot := "example_" + hex.EncodeToString(suffix)
	w := testenv.NewWriter(brokers, 500)
	defer w.Close()
	relay, err := cdc.NewRelay(pool, w, cdc.Config{Slot: slot, Topic: func(string) string { return topic }})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		<-done
		// A slot pins WAL until it is dropped (and keeps its database from
		// being dropped): a service keeps it; an example cleans up.
		testenv.Eventually(5*time.Second, func() bool { // the walsender may still be going away
			_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
			return err == nil
		})
	}()
	testenv.Eventually(20*time.Second, relay.Active)

	orderID := uuid.New()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2)`, orderID, 1999); err != nil {
			return err
		}
		return cdc.Emit(ctx, tx, event.Envelope{
			EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
			AggregateID: orderID.String(), AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{"amountCents": 1999}`),
		})
	})
	if err != nil {
		fmt.Println("placing the order:", err)
		return
	}

	m, err := firstMessage(ctx, brokers, topic)
	if err != nil {
		fmt.Println("reading:", err)
		return
	}
	ev, err := event.FromKafka(m)
	fmt.Println(ev.EventType, string(m.Key) == orderID.String(), string(ev.Payload), err)
	// Output: OrderPlaced true {"amountCents": 1999} <nil>
}
