package outbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Without a relay, WatchBacklog alone keeps the backlog visible: the gauges
// follow the table as rows are enqueued and marked published.
func TestWatchBacklogReportsABacklogNoRelayDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newOutboxDB(t)
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	testenv.RunInBackground(t, "WatchBacklog", func(ctx context.Context) error {
		return m.WatchBacklog(ctx, pool, 20*time.Millisecond, slog.Default())
	})

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for v := int64(1); v <= 3; v++ {
			if err := outbox.Enqueue(ctx, tx, newEvent("a", v)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "3 pending events with a growing oldest age", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_pending_events") == 3 &&
			testenv.MetricValue(t, reg, "outbox_oldest_pending_age_seconds") > 0, nil
	})

	if _, err := pool.Exec(ctx, `UPDATE outbox_events SET state = 'published', published_at = now()`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the backlog to read empty", func() (bool, error) {
		return testenv.MetricValue(t, reg, "outbox_pending_events") == 0 &&
			testenv.MetricValue(t, reg, "outbox_oldest_pending_age_seconds") == 0, nil
	})
}
