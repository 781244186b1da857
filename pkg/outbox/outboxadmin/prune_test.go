package outboxadmin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
)

func TestPruneRemovesOnlyPublishedRowsPastRetention(t *testing.T) {
	t.Parallel()
	for _, archive := range []bool{false, true} {
		t.Run(fmt.Sprintf("archive=%v", archive), func(t *testing.T) {
			ctx := context.Background()
			pool := newOutboxDB(t)
			old := time.Now().Add(-30 * day)
			s := seedRows(t, pool,
				row{AggType: "thing", AggID: "a", Version: 1, State: "published", PublishedAgo: week + time.Hour}, // 0: past the window
				row{AggType: "thing", AggID: "a", Version: 2, State: "published", PublishedAgo: 30 * day},         // 1: long past
				row{AggType: "thing", AggID: "b", Version: 1, State: "published", PublishedAgo: time.Hour},        // 2: recent
				row{AggType: "thing", AggID: "c", Version: 1, State: "published", PublishedAgo: week - time.Hour}, // 3: just inside
				row{AggType: "thing", AggID: "d", Version: 1, State: "pending", CreatedAt: old},                   // 4: old but not done
				row{AggType: "thing", AggID: "e", Version: 1, State: "dead", CreatedAt: old},                      // 5: old but dead
			)
			// As if they had been published once and set back by hand: the state,
			// not published_at, says whether a row is done.
			if _, err := pool.Exec(ctx, "UPDATE outbox_events SET published_at = now() - interval '30 days' WHERE id = ANY($1)",
				idsOf(s, 4, 5)); err != nil {
				t.Fatal(err)
			}
			doomed := idsOf(s, 0, 1)
			before := snapshot(t, pool, "outbox_events", "id = ANY($1)", doomed)

			n, err := outboxadmin.Prune(ctx, pool, outbox.PruneConfig{Archive: archive}) // default retention: 7 days
			if err != nil {
				t.Fatal(err)
			}
			if n != 2 {
				t.Fatalf("Prune removed %d rows, want 2", n)
			}
			equalIDs(t, "left in outbox_events", tableIDs(t, pool, "outbox_events", "true"), idsOf(s, 2, 3, 4, 5))
			archived := tableIDs(t, pool, "outbox_events_archive", "true")
			if !archive {
				equalIDs(t, "archived without Archive", archived, []int64{})
				return
			}
			equalIDs(t, "archived", archived, doomed)
			// Every column survives the move, the id included. A column added to
			// outbox_events and not to the archive shows up here.
			if after := snapshot(t, pool, "outbox_events_archive", "true"); after != before {
				t.Fatalf("archived rows differ from the originals:\n got %s\nwant %s", after, before)
			}
		})
	}
}

func TestPruneWorksInBatchesOldestFirst(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		old       int // published rows past the window
		batchSize int
		batches   []int // expected rows per batch, checked in archive mode
	}{
		{"several batches, last one short", 10, 3, []int{3, 3, 3, 1}},
		{"exact multiple of the batch size", 9, 3, []int{3, 3, 3}},
		{"one batch", 4, 0, []int{4}}, // default batch size
		{"nothing to prune", 0, 3, nil},
	}
	for _, tt := range tests {
		for _, archive := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/archive=%v", tt.name, archive), func(t *testing.T) {
				ctx := context.Background()
				pool := newOutboxDB(t)
				var rows []row
				// Later rows were published earlier, so oldest first is not id order.
				for i := range tt.old {
					rows = append(rows, row{AggType: "thing", AggID: fmt.Sprint("old-", i), Version: 1, State: "published", PublishedAgo: 8*day + time.Duration(i)*time.Hour})
				}
				rows = append(rows,
					row{AggType: "thing", AggID: "recent-1", Version: 1, State: "published", PublishedAgo: time.Minute},
					row{AggType: "thing", AggID: "recent-2", Version: 1, State: "published", PublishedAgo: 6 * day},
					row{AggType: "thing", AggID: "waiting", Version: 1, State: "pending"},
				)
				s := seedRows(t, pool, rows...)

				n, err := outboxadmin.Prune(ctx, pool, outbox.PruneConfig{BatchSize: tt.batchSize, Archive: archive})
				if err != nil {
					t.Fatal(err)
				}
				if n != tt.old {
					t.Fatalf("Prune removed %d rows, want %d", n, tt.old)
				}
				equalIDs(t, "left in outbox_events", tableIDs(t, pool, "outbox_events", "true"),
					idsOf(s, tt.old, tt.old+1, tt.old+2))
				if !archive {
					return
				}
				// Each batch is its own transaction, so its rows share an archived_at
				// (now() is the transaction's start) that no other batch has.
				rs, err := pool.Query(ctx, `SELECT array_agg(id ORDER BY published_at) FROM outbox_events_archive
					GROUP BY archived_at ORDER BY archived_at`)
				if err != nil {
					t.Fatal(err)
				}
				got, err := pgx.CollectRows(rs, pgx.RowTo[[]int64])
				if err != nil {
					t.Fatal(err)
				}
				var want [][]int64
				next := tt.old - 1 // the oldest published row is the last seeded
				for _, size := range tt.batches {
					var batch []int64
					for range size {
						batch = append(batch, s[next].ID)
						next--
					}
					want = append(want, batch)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("archived batches (oldest publication first) %v, want %v", got, want)
				}
			})
		}
	}
}
