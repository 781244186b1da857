package prove_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/loadtest/prove"
	"github.com/onceflow/onceflow/platform/harness"
)

// TestQuickNemesis is the nemesis's quick form in `make test`: the platform
// production-shaped under a seeded random schedule for the quick profile's
// NemesisDuration, in one relay mode chosen by the seed, then the history
// checked by package check. ONCEFLOW_NEMESIS_SEED replays a seed (the test
// prints the seed it used, and the command that replays it); ONCEFLOW_NEMESIS
// narrows the fault kinds as NEMESIS= does.
//
// A failure says which of two things happened, and they read differently:
// "the harness could not run" is harness trouble (a server that would not
// start, a platform that never went quiet); "the nemesis found N
// violations" is the platform breaking an invariant, with each finding's
// order story in the log and the history file to re-check.
func TestQuickNemesis(t *testing.T) {
	root := harness.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	seed := envInt(t, "ONCEFLOW_NEMESIS_SEED", time.Now().UnixNano()%1_000_000)
	modes := []string{"poll", "cdc", "wal"}
	mode := modes[seed%int64(len(modes))]
	opts := prove.Options{Root: root, Dir: filepath.Join(root, ".prove", "test-nemesis"), Profile: prove.Profiles["quick"],
		Out: &lineLogger{t: t}, Only: []string{"nemesis"}, RelayModes: []string{mode},
		Nemesis: prove.NemesisOptions{Seed: seed}}
	if v := os.Getenv("ONCEFLOW_NEMESIS"); v != "" {
		opts.Nemesis.Kinds = strings.Split(v, ",")
	}
	t.Logf("SEED=%d RELAY_MODE=%s (replay: ONCEFLOW_NEMESIS_SEED=%d go test -run TestQuickNemesis ./loadtest/prove/)", seed, mode, seed)
	rep := runQuick(t, ctx, opts)
	if len(rep.Rows) != 1 {
		t.Fatalf("want one report row for the nemesis, got %d", len(rep.Rows))
	}
	r := rep.Rows[0]
	if r.Error != "" {
		t.Fatalf("the harness could not finish the run (not a finding; SEED=%d RELAY_MODE=%s): %s", seed, mode, r.Error)
	}
	if r.Faults == 0 {
		t.Fatalf("the nemesis applied no fault (SEED=%d)", seed)
	}
	if findings := r.Broken(); len(findings) > 0 {
		t.Errorf("the nemesis found violations (SEED=%d RELAY_MODE=%s; each finding's story is in the log above, "+
			"the history beside the run's logs):\n  %s", seed, mode, strings.Join(findings, "\n  "))
	}
}
