package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// The handler's tests run the real inbox path (dedupe, retries, dead
// letters) without Kafka, on a database cloned from a template migrated
// with the inbox's schema and the service's own migrations: the schema
// production runs.
func newDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return inboxtest.NewDatabase(t, testenv.Migration{FS: Migrations, Table: MigrationsTable})
}

// OrderPlaced ships the order once, however often Kafka delivers it.
func TestHandleShipsOnce(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	ev := orderEvent("OrderPlaced")
	dead := inboxtest.Deliver(t, pool, inbox.Config{Name: consumerName}, handle, ev, ev) // twice: a redelivery
	if len(dead) != 0 {
		t.Fatalf("%d dead letters, want none", len(dead))
	}
	inboxtest.RequireProcessed(t, pool, consumerName, ev.EventID)
	var n int
	if err := pool.QueryRow(context.Background(), countShipments, ev.AggregateID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d shipments (%v), want 1", n, err)
	}
}

// An event type the handler does not know is dead-lettered at its first
// attempt (inbox.Permanent), not retried MaxAttempts times, and its status
// says so.
func TestHandleDeadLettersAnUnknownTypeAtOnce(t *testing.T) {
	t.Parallel()
	pool := newDatabase(t)
	ev := orderEvent("OrderGiftWrapped")
	dead := inboxtest.Deliver(t, pool, inbox.Config{Name: consumerName, MaxAttempts: 5}, handle, ev)
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	msgs, err := inboxadmin.MessagesOf(context.Background(), pool, ev.AggregateID)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("MessagesOf = %+v, %v", msgs, err)
	}
	if m := msgs[0]; m.Status != "dead_lettered" || m.Attempts != 1 {
		t.Errorf("the unknown event is %s after %d attempts, want dead_lettered after 1", m.Status, m.Attempts)
	}
}

// The order and its event commit together: outboxtest reads what the
// transaction enqueued, on a database with the outbox's schema and the
// service's own.
func TestPlacingEnqueuesOrderPlaced(t *testing.T) {
	t.Parallel()
	pool := outboxtest.NewDatabase(t, testenv.Migration{FS: Migrations, Table: MigrationsTable})
	ev := orderEvent("OrderPlaced")
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertOrder, event.NewID(), 1999); err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, ev)
	})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireEnqueued(t, pool, outboxtest.Match{EventType: "OrderPlaced", AggregateID: ev.AggregateID})
}

func orderEvent(eventType string) event.Envelope {
	id := event.NewID().String()
	return event.Envelope{EventID: event.NewID(), EventType: eventType, EventVersion: 1,
		AggregateType: "order", AggregateID: id, AggregateVersion: 1,
		OccurredAt: time.Now(), Payload: []byte(`{"orderId":"` + id + `"}`)}
}
