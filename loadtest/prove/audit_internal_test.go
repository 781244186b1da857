package prove

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
)

// idCDCPendingQuery is the audit's cdc test before issue 30's follow-up:
// published is anything at or below the slot's confirmed_id. Kept to show
// what it misjudged.
const idCDCPendingQuery = `SELECT count(*) FROM outbox_events
		WHERE state = 'dead' OR id > coalesce((SELECT max(confirmed_id) FROM outbox_cdc_slots), 0)`

// TestCDCPendingFollowsCommitOrder: a transaction that inserted first (the
// lower id) and commits after a higher-id one is not published when the
// slot confirmed the higher one. The relay's horizon (published_xmin) was
// taken while it was open, so it is not older than that horizon; the
// audit must count its row pending, where the id test calls it published.
// Once a horizon taken after its commit is published, nothing is pending.
func TestCDCPendingFollowsCommitOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := outboxtest.NewDatabase(t)

	early, err := pool.Begin(ctx) // inserts first: the lower id
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback(ctx)
	enqueue(ctx, t, early)
	var lateID int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		enqueue(ctx, t, tx)
		return tx.QueryRow(ctx, `SELECT max(id) FROM outbox_events`).Scan(&lateID)
	}); err != nil {
		t.Fatal(err)
	}
	// The relay confirmed the later transaction (confirmed_id is its row's
	// id) and promoted a horizon taken while the early one was running:
	// what advanceHorizon records.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_cdc_slots (slot_name, confirmed_lsn, confirmed_id, published_xmin)
		VALUES ('audit', pg_current_wal_lsn(), $1, pg_snapshot_xmin(pg_current_snapshot())::xid)`, lateID); err != nil {
		t.Fatal(err)
	}
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	byID, byCommit := count(ctx, t, pool, idCDCPendingQuery), count(ctx, t, pool, pendingQuery("cdc"))
	t.Logf("pending after the out-of-order commit: by id %d, by commit order %d", byID, byCommit)
	if byID != 0 {
		t.Errorf("the id test counts %d pending; it was expected to misjudge the early row as published (0)", byID)
	}
	if byCommit != 2 {
		t.Errorf("pending by commit order = %d, want 2: neither transaction is older than the published horizon", byCommit)
	}

	// A horizon after both committed, once published: both rows are. (A
	// new xid rather than a snapshot's xmin, which another test's
	// transaction anywhere in the cluster may hold back.)
	if _, err := pool.Exec(ctx, `UPDATE outbox_cdc_slots SET published_xmin = pg_current_xact_id()::xid`); err != nil {
		t.Fatal(err)
	}
	if n := count(ctx, t, pool, pendingQuery("cdc")); n != 0 {
		t.Errorf("pending by commit order after a later horizon = %d, want 0", n)
	}
}

func enqueue(ctx context.Context, t *testing.T, tx pgx.Tx) {
	t.Helper()
	if err := outbox.Enqueue(ctx, tx, event.Envelope{
		EventID: uuid.New(), EventType: "OrderPlaced", EventVersion: 1, AggregateType: "order",
		AggregateID: uuid.NewString(), AggregateVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`),
	}); err != nil {
		t.Fatal(err)
	}
}

func count(ctx context.Context, t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
