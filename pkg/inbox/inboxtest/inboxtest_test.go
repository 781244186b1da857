package inboxtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
)

func newInboxDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := inboxtest.NewDatabase(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (event_id uuid PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func ev(aggregateID string, version int64) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: "ThingHappened", EventVersion: 1, AggregateType: "thing",
		AggregateID: aggregateID, AggregateVersion: version, OccurredAt: time.Now(), Payload: []byte(`{}`),
	}
}

func record(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, e.EventID)
	return err
}

func effects(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDeliverRunsTheRealInboxPath(t *testing.T) {
	t.Parallel()
	pool := newInboxDB(t)
	cfg := inbox.Config{Name: "billing"}
	first, second := ev("a", 1), ev("a", 2)

	// A duplicate, within one delivery and across two, has one effect.
	if dl := inboxtest.Deliver(t, pool, cfg, record, first, second, first); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	inboxtest.Deliver(t, pool, cfg, record, second)
	if n := effects(t, pool); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
	inboxtest.RequireProcessed(t, pool, "billing", first.EventID)
	inboxtest.RequireProcessed(t, pool, "billing", second.EventID)

	// The version guard: an older version than the last applied (another
	// event id) is dead-lettered, visibly, with its reason (the default,
	// SkipStale false), or skipped as stale when the consumer opts in.
	old := ev("a", 1)
	if dl := inboxtest.Deliver(t, pool, cfg, record, old); len(dl) != 1 {
		t.Fatalf("an older version gave %d dead letters, want 1", len(dl))
	}
	inboxtest.RequireStatus(t, pool, "billing", old.EventID, "dead_lettered")
	older := ev("a", 1)
	inboxtest.Deliver(t, pool, inbox.Config{Name: "billing", SkipStale: true}, record, older)
	inboxtest.RequireStatus(t, pool, "billing", older.EventID, "stale")

	// A permanent failure is dead-lettered, and the handler's work undone.
	poison := ev("b", 1)
	dl := inboxtest.Deliver(t, pool, cfg, func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
		if err := record(ctx, tx, e); err != nil {
			return err
		}
		return inbox.Permanent(errors.New("bad order"))
	}, poison)
	if len(dl) != 1 || dl[0].Topic != inboxtest.Topic+".dlt" {
		t.Fatalf("dead letters %v, want one to %s.dlt", dl, inboxtest.Topic)
	}
	inboxtest.RequireStatus(t, pool, "billing", poison.EventID, "dead_lettered")
	if n := effects(t, pool); n != 2 {
		t.Fatalf("%d effects after the poison, want still 2", n)
	}
	inboxtest.RequireNotReceived(t, pool, "other", first.EventID)
	if n := inboxtest.Count(t, pool, "billing"); n != 5 {
		t.Fatalf("inbox of billing holds %d events, want 5", n)
	}
}
