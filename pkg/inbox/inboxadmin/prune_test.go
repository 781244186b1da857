package inboxadmin_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
)

func TestPruneRemovesOnlyProcessedRowsPastRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxtest.NewDatabase(t)
	ids := make([]uuid.UUID, 8)
	for i := range ids {
		ids[i] = uuid.New()
	}
	inboxtesting.SeedRows(t, pool,
		inboxtesting.NewRow("billing", ids[6], "stale", 31*inboxtesting.Day), // skipped by the version guard, past retention
		inboxtesting.NewRow("billing", ids[7], "stale", time.Hour),
		inboxtesting.NewRow("billing", ids[0], "processed", 31*inboxtesting.Day),      // past the default 30 days
		inboxtesting.NewRow("shim", ids[1], "processed", 400*inboxtesting.Day),        // long past, another consumer
		inboxtesting.NewRow("billing", ids[2], "processed", time.Hour),                // recent
		inboxtesting.NewRow("billing", ids[3], "processed", 29*inboxtesting.Day),      // just inside
		inboxtesting.NewRow("billing", ids[4], "dead_lettered", 400*inboxtesting.Day), // old, but the audit of a dead letter
		inboxtesting.NewRow("shim", ids[5], "dead_lettered", time.Hour),
	)

	n, err := inboxadmin.Prune(ctx, pool, inbox.PruneConfig{}) // default retention: 30 days
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("Prune removed %d rows, want 3", n)
	}
	inboxtesting.EqualStrings(t, "left in inbox_messages", inboxtesting.Rows(t, pool), inboxtesting.SortedKeys(
		inboxtesting.RowKey("billing", "processed", ids[2]),
		inboxtesting.RowKey("billing", "processed", ids[3]),
		inboxtesting.RowKey("billing", "dead_lettered", ids[4]),
		inboxtesting.RowKey("shim", "dead_lettered", ids[5]),
		inboxtesting.RowKey("billing", "stale", ids[7]),
	))

	if n, err := inboxadmin.Prune(ctx, pool, inbox.PruneConfig{Retention: 2 * time.Hour}); err != nil || n != 1 {
		t.Fatalf("Prune with a 2h retention = %d, %v; want the 29-day-old row only", n, err)
	}
	inboxtesting.EqualStrings(t, "left after a 2h retention", inboxtesting.Rows(t, pool), inboxtesting.SortedKeys(
		inboxtesting.RowKey("billing", "processed", ids[2]),
		inboxtesting.RowKey("billing", "dead_lettered", ids[4]),
		inboxtesting.RowKey("shim", "dead_lettered", ids[5]),
		inboxtesting.RowKey("billing", "stale", ids[7]),
	))
}

// batchRecorder is the real pool, recording what each of Prune's statements
// removed and which rows were left after it.
type batchRecorder struct {
	*pgxpool.Pool
	t       *testing.T
	removed []int64
	left    [][]string
}

func (b *batchRecorder) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := b.Pool.Exec(ctx, sql, args...)
	if err == nil {
		b.removed = append(b.removed, tag.RowsAffected())
		b.left = append(b.left, inboxtesting.Rows(b.t, b.Pool))
	}
	return tag, err
}

func TestPruneWorksInBatchesOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxtest.NewDatabase(t)
	old := make([]uuid.UUID, 5)
	var rows []inboxtesting.Row
	for i := range old {
		old[i] = uuid.New()
		// Later rows are older, so oldest first is not insertion order.
		rows = append(rows, inboxtesting.NewRow("billing", old[i], "processed", 40*inboxtesting.Day+time.Duration(i)*time.Hour))
	}
	recent, dead := uuid.New(), uuid.New()
	rows = append(rows,
		inboxtesting.NewRow("billing", recent, "processed", time.Minute),
		inboxtesting.NewRow("billing", dead, "dead_lettered", 50*inboxtesting.Day),
	)
	inboxtesting.SeedRows(t, pool, rows...)

	rec := &batchRecorder{Pool: pool, t: t}
	n, err := inboxadmin.Prune(ctx, rec, inbox.PruneConfig{BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("Prune removed %d rows, want 5", n)
	}
	// Then one statement for the originals kept of truncated dead letters
	// (none here).
	if fmt.Sprint(rec.removed) != "[2 2 1 0]" {
		t.Fatalf("rows removed per statement = %v, want [2 2 1 0]", rec.removed)
	}
	keep := []string{inboxtesting.RowKey("billing", "processed", recent), inboxtesting.RowKey("billing", "dead_lettered", dead)}
	want := [][]string{
		inboxtesting.SortedKeys(append(slices.Clone(keep), inboxtesting.RowKey("billing", "processed", old[0]), inboxtesting.RowKey("billing", "processed", old[1]), inboxtesting.RowKey("billing", "processed", old[2]))...),
		inboxtesting.SortedKeys(append(slices.Clone(keep), inboxtesting.RowKey("billing", "processed", old[0]))...),
		inboxtesting.SortedKeys(slices.Clone(keep)...),
	}
	for i := range want {
		inboxtesting.EqualStrings(t, fmt.Sprintf("left after batch %d", i+1), rec.left[i], want[i])
	}

	rec.removed = nil
	if n, err := inboxadmin.Prune(ctx, rec, inbox.PruneConfig{BatchSize: 2}); err != nil || n != 0 {
		t.Fatalf("second Prune = %d, %v; want 0, nil", n, err)
	}
	if fmt.Sprint(rec.removed) != "[0 0]" {
		t.Fatalf("second Prune ran statements removing %v, want one removing nothing (and the originals' one)", rec.removed)
	}
}
