package outbox_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestPrunerPrunesAtStartAndEveryInterval(t *testing.T) {
	t.Parallel()
	pool := newOutboxDB(t)
	s := seedRows(t, pool,
		row{AggType: "thing", AggID: "a", Version: 1, State: "published", PublishedAgo: 8 * day},
		row{AggType: "thing", AggID: "a", Version: 2, State: "published", PublishedAgo: 9 * day},
		row{AggType: "thing", AggID: "b", Version: 1, State: "pending"},
	)
	logs := &testenv.LogBuffer{}
	pruner, err := outbox.NewPruner(pool, outbox.PrunerConfig{
		PruneConfig: outbox.PruneConfig{Archive: true},
		Interval:    50 * time.Millisecond,
		Logger:      slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := testenv.RunInBackground(t, "the pruner", pruner.Run)

	// The pruner logs after its transaction commits: wait for both.
	testenv.WaitFor(t, 10*time.Second, "the first run to archive the two old rows and log it", func() (bool, error) {
		_, logged := logs.Record("outbox pruned published events")
		return logged && len(tableIDs(t, pool, "outbox_events_archive", "true")) == 2, nil
	})
	rec, ok := logs.Record("outbox pruned published events")
	if !ok || rec["rows_removed"] != float64(2) || rec["archive"] != true {
		t.Fatalf("first run's log record = %v, want rows_removed 2 and archive true\n%s", rec, logs.String())
	}

	later := seedRows(t, pool, row{AggType: "thing", AggID: "c", Version: 1, State: "published", PublishedAgo: 10 * day})
	testenv.WaitFor(t, 10*time.Second, "a later run to archive a row published since and log it", func() (bool, error) {
		return strings.Contains(logs.String(), `"rows_removed":1`) && len(tableIDs(t, pool, "outbox_events_archive", "true")) == 3, nil
	})
	if !strings.Contains(logs.String(), `"rows_removed":1`) {
		t.Fatalf("no log record of the later run removing 1 row:\n%s", logs.String())
	}
	equalIDs(t, "archived", tableIDs(t, pool, "outbox_events_archive", "true"), []int64{s[0].ID, s[1].ID, later[0].ID})
	equalIDs(t, "left in outbox_events", tableIDs(t, pool, "outbox_events", "true"), idsOf(s, 2))

	stop()
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("the pruner logged an error:\n%s", logs.String())
	}
}
