package outboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
)

// Once the cause of dead events is fixed (here, a topic that did not exist),
// an operator lists them and sets them back to pending with a fresh budget of
// attempts; the relay then publishes them, and the later events of their
// aggregates that waited behind them.
func ExampleRequeueDead() {
	ctx := context.Background()
	pool, _, _, cleanup := exampleSetup(ctx)
	defer cleanup()
	if err := enqueueOrders(ctx, pool, "order-1", "order-2"); err != nil {
		fmt.Println(err)
		return
	}
	// Stand in for the relay, which gave up on both.
	_, err := pool.Exec(ctx, `UPDATE outbox_events SET state = 'dead', attempts = 10, last_error = 'unknown topic'`)
	if err != nil {
		fmt.Println(err)
		return
	}

	dead, err := outboxadmin.ListDead(ctx, pool, 100)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range dead {
		fmt.Printf("dead: %s v%d after %d attempts: %s\n", d.AggregateID, d.AggregateVersion, d.Attempts, d.LastError)
	}
	n, err := outboxadmin.RequeueDead(ctx, pool, outbox.ModePoll, outboxadmin.DeadFilter{AggregateType: "order"})
	fmt.Println("requeued:", n, err)
	dead, err = outboxadmin.ListDead(ctx, pool, 100)
	fmt.Println("still dead:", len(dead), err)
	// Output:
	// dead: order-1 v1 after 10 attempts: unknown topic
	// dead: order-2 v1 after 10 attempts: unknown topic
	// requeued: 2 <nil>
	// still dead: 0 <nil>
}

// enqueueOrders commits one OrderPlaced event per order id, in order.
func enqueueOrders(ctx context.Context, pool *pgxpool.Pool, orderIDs ...string) error {
	evs := make([]event.Envelope, len(orderIDs))
	for i, id := range orderIDs {
		evs[i] = event.Envelope{
			EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1,
			AggregateType: "order", AggregateID: id, AggregateVersion: 1,
			OccurredAt: time.Now(), Payload: []byte(`{"orderId":"` + id + `"}`),
		}
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.EnqueueBatch(ctx, tx, evs...) })
}

// A service acts in its own relay mode: the log-based relay never reads an
// updated row, so in RELAY_MODE=cdc a requeue writes the dead event again
// as a new row (same event id) that the replication stream carries, and in
// RELAY_MODE=wal, which keeps no copy of what it published, a replay is
// refused rather than answered with a success that will not happen.
func ExampleRequeue() {
	ctx := context.Background()
	pool, _, _, cleanup := exampleSetup(ctx)
	defer cleanup()
	if err := enqueueOrders(ctx, pool, "order-1"); err != nil {
		fmt.Println(err)
		return
	}
	var id int64
	// Stand in for the log-based relay, which gave up on it.
	if err := pool.QueryRow(ctx, `UPDATE outbox_events SET state = 'dead', last_error = 'too large' RETURNING id`).Scan(&id); err != nil {
		fmt.Println(err)
		return
	}

	n, err := outboxadmin.Requeue(ctx, pool, outbox.ModeCDC, id)
	fmt.Println("requeued:", n, err)
	var newID int64
	var state string
	_ = pool.QueryRow(ctx, `SELECT id, state FROM outbox_events WHERE aggregate_id = 'order-1'`).Scan(&newID, &state)
	fmt.Println("written again as a new row:", newID > id, state)

	_, err = outboxadmin.Replay(ctx, pool, outbox.ModeWAL, outboxadmin.ReplayFilter{AggregateType: "order", From: time.Now().Add(-time.Hour)}, false)
	fmt.Println("wal replay refused:", errors.Is(err, outboxadmin.ErrNotInThisMode))
	// Output:
	// requeued: 1 <nil>
	// written again as a new row: true pending
	// wal replay refused: true
}

// Operators replay a window of published events; the dry run only lists them.
func ExampleReplay() {
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

	items, err := outboxadmin.Replay(ctx, pool, outbox.ModePoll, outboxadmin.ReplayFilter{
		AggregateType: "order", AggregateID: "order-42", From: time.Now().Add(-time.Hour),
	}, true)
	fmt.Println(len(items), items[0].EventType, items[0].AggregateVersion, err)
	// Output: 1 OrderPlaced 1 <nil>
}

// Published events stay for a retention window, in which they can be
// replayed, and are then pruned: here moved to outbox_events_archive. Pending
// and dead rows are never pruned, however old. A service runs this in the
// background with outbox.NewPruner(pool, cfg).Run(ctx).
func ExamplePrune() {
	ctx := context.Background()
	pool, _, _, cleanup := exampleSetup(ctx)
	defer cleanup()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, id := range []string{"order-1", "order-2", "order-3"} {
			if err := outbox.Enqueue(ctx, tx, event.Envelope{
				EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
				AggregateID: id, AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Stand in for the relay, which published two of them eight days ago.
	_, err = pool.Exec(ctx, `UPDATE outbox_events SET state = 'published', published_at = now() - interval '8 days'
		WHERE aggregate_id IN ('order-1', 'order-2')`)
	if err != nil {
		fmt.Println(err)
		return
	}

	n, err := outboxadmin.Prune(ctx, pool, outbox.PruneConfig{Retention: 7 * 24 * time.Hour, Archive: true})
	fmt.Println("archived:", n, err)
	// Output: archived: 2 <nil>
}
