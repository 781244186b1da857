package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// ModeDebezium: an external publisher streams the rows and marks none of
// them, so retention removes pending rows by age, the backlog is read from
// the publisher's slot, and the operator actions write events again as new
// rows or refuse.

func TestPruneRemovesPendingRowsOnlyPastPendingRetention(t *testing.T) {
	t.Parallel()
	for _, archive := range []bool{false, true} {
		t.Run(fmt.Sprintf("archive=%v", archive), func(t *testing.T) {
			ctx := context.Background()
			pool := adminDB(t)
			s := seedRows(t, pool,
				row{AggType: "thing", AggID: "a", Version: 1, State: "pending", CreatedAt: time.Now().Add(-3 * day)},         // 0: past the pending retention
				row{AggType: "thing", AggID: "a", Version: 2, State: "pending", CreatedAt: time.Now().Add(-day - time.Hour)}, // 1: just past it
				row{AggType: "thing", AggID: "b", Version: 1, State: "pending", CreatedAt: time.Now().Add(-day + time.Hour)}, // 2: just inside
				row{AggType: "thing", AggID: "c", Version: 1, State: "pending"},                                              // 3: new
				row{AggType: "thing", AggID: "d", Version: 1, State: "published", PublishedAgo: 8 * day},                     // 4: past Retention
				row{AggType: "thing", AggID: "e", Version: 1, State: "dead", CreatedAt: time.Now().Add(-30 * day)},           // 5: old but dead
			)

			// Without PendingRetention no pending row is touched, however old.
			n, err := outboxadmin.Prune(ctx, pool, outbox.PruneConfig{Archive: archive})
			if err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("Prune without PendingRetention removed %d rows, want 1 (the published one)", n)
			}

			n, err = outboxadmin.Prune(ctx, pool, outbox.PruneConfig{Archive: archive, PendingRetention: day, BatchSize: 1})
			if err != nil {
				t.Fatal(err)
			}
			if n != 2 {
				t.Fatalf("Prune with PendingRetention 24h removed %d rows, want 2", n)
			}
			equalIDs(t, "left in outbox_events", tableIDs(t, pool, "outbox_events", "true"), idsOf(s, 2, 3, 5))
			want := []int64{}
			if archive {
				want = idsOf(s, 0, 1, 4)
			}
			equalIDs(t, "archived", tableIDs(t, pool, "outbox_events_archive", "true"), want)
		})
	}
}

func TestPruneConfigRefusesANegativePendingRetention(t *testing.T) {
	t.Parallel()
	err := outbox.PruneConfig{PendingRetention: -time.Hour}.Validate()
	if err == nil {
		t.Fatal("a negative PendingRetention was accepted")
	}
}

// WatchSlot reads a slot this process does not stream from: missing, then
// created and behind, then streamed by a publisher (a Relay stands in for
// Debezium: any walsender on the slot counts), then left alone again.
func TestWatchSlotReportsAnExternalPublishersSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCDCEnv(t, 1, 10)
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	value := func(name string) float64 { return testenv.MetricValue(t, reg, name) }
	if value("outbox_external_publisher_streaming") != 1 {
		t.Fatal("outbox_external_publisher_streaming is not 1 before WatchSlot: a service with a relay of its own would page for Debezium")
	}
	testenv.RunInBackground(t, "WatchSlot", func(ctx context.Context) error {
		return m.WatchSlot(ctx, e.Pool, e.slot, 20*time.Millisecond, slog.Default())
	})

	// No slot yet: nobody streams, nothing is measured behind.
	testenv.WaitFor(t, 10*time.Second, "the missing slot read as not streaming", func() (bool, error) {
		return value("outbox_external_publisher_streaming") == 0 && value("outbox_slot_lag_bytes") == 0, nil
	})

	// The publisher's slot exists and events are written, but nobody reads them.
	if _, err := e.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		for v := int64(1); v <= 20; v++ {
			if err := outbox.Enqueue(ctx, tx, newEvent("a", v)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	seedRows(t, e.Pool, row{AggType: "thing", AggID: "dead", Version: 1, State: "dead"})
	testenv.WaitFor(t, 10*time.Second, "the slot's lag, retained WAL and the dead row", func() (bool, error) {
		return value("outbox_slot_lag_bytes") > 0 && value("outbox_slot_retained_wal_bytes") > 0 &&
			value("outbox_slot_wal_keep_size_bytes") != 0 && value("outbox_dead_events") == 1 &&
			value("outbox_external_publisher_streaming") == 0, nil
	})
	if got := value("outbox_pending_events"); got != 0 {
		t.Errorf("outbox_pending_events = %v: WatchSlot must leave the table's backlog gauges alone", got)
	}

	// A publisher streams from the slot and catches up.
	stop := runStreaming(t, newCDC(t, e.Pool, e.W, e.config()))
	testenv.WaitFor(t, 20*time.Second, "the slot read as streaming, its lag confirmed away", func() (bool, error) {
		return value("outbox_external_publisher_streaming") == 1 && value("outbox_slot_lag_bytes") < 1<<20 &&
			e.C.Distinct() >= 20, nil
	})
	if got := value("outbox_slot_active"); got != 0 {
		t.Errorf("outbox_slot_active = %v: it is this process's own relay's, and WatchSlot's process runs none", got)
	}

	// The publisher stops: the slot stays, nobody reads it.
	stop()
	testenv.WaitFor(t, 20*time.Second, "the slot read as not streaming again", func() (bool, error) {
		return value("outbox_external_publisher_streaming") == 0, nil
	})
}

// Debezium marks no row dead or published: a requeue writes a dead row (one
// from a time the outbox ran another mode) again as a new row, which the
// publication streams; a requeue that finds none is refused; a replay
// writes every row of its window that is not dead again.
func TestDebeziumModeOperatorActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := adminDB(t)
	mode := outbox.ModeDebezium
	s := seedRows(t, pool,
		row{AggType: "thing", AggID: "a", Version: 1, State: "dead"},                               // 0: dead, from another mode
		row{AggType: "thing", AggID: "a", Version: 2, State: "pending"},                            // 1: streamed or not, nobody knows
		row{AggType: "thing", AggID: "b", Version: 1, State: "published", PublishedAgo: time.Hour}, // 2: from the polling relay's time
		row{AggType: "other", AggID: "c", Version: 1, State: "pending"},                            // 3: another aggregate type
	)

	n, err := outboxadmin.Requeue(ctx, pool, mode, s[0].ID)
	if err != nil || n != 1 {
		t.Fatalf("Requeue of the dead row = %d, %v; want 1", n, err)
	}
	var state string
	var newID int64
	if err := pool.QueryRow(ctx, `SELECT id, state FROM outbox_events WHERE event_id = $1`, s[0].EventID).Scan(&newID, &state); err != nil {
		t.Fatal(err)
	}
	if newID <= s[3].ID || state != "pending" {
		t.Fatalf("the requeued event is row %d in state %s; want a new pending row (an insert, which the publication streams)", newID, state)
	}
	if _, err := outboxadmin.RequeueDead(ctx, pool, mode, outboxadmin.DeadFilter{}); !errors.Is(err, outboxadmin.ErrNotInThisMode) {
		t.Fatalf("RequeueDead with no dead row = %v; want ErrNotInThisMode (Debezium keeps no dead events)", err)
	}

	f := outboxadmin.ReplayFilter{AggregateType: "thing", From: time.Now().Add(-time.Hour)}
	dry, err := outboxadmin.Replay(ctx, pool, mode, f, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(dry) != 3 {
		t.Fatalf("the replay's scope has %d rows, want 3 (every row of the window that is not dead)", len(dry))
	}
	items, err := outboxadmin.Replay(ctx, pool, mode, f, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 3 {
		t.Fatalf("replayed %d rows, want 3", len(items))
	}
	for _, it := range items {
		if it.ID <= newID {
			t.Errorf("replayed event %s is row %d: want a new row, written again", it.EventID, it.ID)
		}
	}
	equalIDs(t, "rows of the other aggregate type", tableIDs(t, pool, "outbox_events", "aggregate_type = 'other'"), idsOf(s, 3))
}
