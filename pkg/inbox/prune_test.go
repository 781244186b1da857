package inbox_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestPrunerPrunesAtStartAndEveryInterval(t *testing.T) {
	t.Parallel()
	pool := inboxtest.NewDatabase(t)
	first, second, kept := uuid.New(), uuid.New(), uuid.New()
	inboxtesting.SeedRows(t, pool,
		inboxtesting.NewRow("billing", first, "processed", 31*inboxtesting.Day),
		inboxtesting.NewRow("billing", kept, "dead_lettered", 31*inboxtesting.Day),
	)
	logs := &testenv.LogBuffer{}
	pruner, err := inbox.NewPruner(pool, inbox.PrunerConfig{
		Interval: 50 * time.Millisecond,
		Logger:   slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := testenv.RunInBackground(t, "the pruner", pruner.Run)

	// The row is gone once the delete commits, a moment before the pruner
	// logs it: wait for both, or a slow machine reads the log too early.
	testenv.WaitFor(t, 10*time.Second, "the first run to prune the old processed row and log it", func() (bool, error) {
		_, logged := logs.Record("inbox pruned processed messages")
		return logged && len(inboxtesting.Rows(t, pool)) == 1, nil
	})
	rec, ok := logs.Record("inbox pruned processed messages")
	if !ok || rec["rows_removed"] != float64(1) {
		t.Fatalf("first run's log record = %v, want rows_removed 1\n%s", rec, logs.String())
	}
	inboxtesting.SeedRows(t, pool, inboxtesting.NewRow("billing", second, "processed", 60*inboxtesting.Day))
	testenv.WaitFor(t, 10*time.Second, "a later run to prune a row added since", func() (bool, error) {
		return len(inboxtesting.Rows(t, pool)) == 1, nil
	})
	inboxtesting.EqualStrings(t, "left", inboxtesting.Rows(t, pool), []string{inboxtesting.RowKey("billing", "dead_lettered", kept)})

	stop()
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("the pruner logged an error:\n%s", logs.String())
	}
}
