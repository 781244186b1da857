package cdc_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/testenv"
)

// The log-based relay publishes a stream of commits without a statement per
// commit on its pool: no check of rows that were never delivered before
// (only a redelivered stretch is checked,
// TestCDCRedeliveredRowRequeuedMeanwhileGoesOutOnce), and its confirmed
// position recorded in outbox_cdc_slots at most every RetentionInterval, not
// with every acknowledgement (the slot itself knows it). Statements are
// counted on the relay's pool, so the test does not take the relay's word
// for it.
func TestCDCRelayRunsNoStatementPerCommit(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 50)
	pool, c := e.Pool, e.C
	relayPool, counts := e.CountingPool(t)
	// No gauge refresh during the test; retention and the record keep
	// their defaults.
	cfg := e.config()
	cfg.LagInterval = time.Hour
	runStreaming(t, newCDC(t, relayPool, e.W, cfg))
	// The first event starts the topic's lane, which reads the dead rows
	// once; count from the second.
	enqueue(t, pool, newEvent("warm-up", 1))
	testenv.WaitFor(t, 10*time.Second, "the warm-up event", func() (bool, error) { return c.Distinct() == 1, nil })

	before := counts.Snapshot()
	start := time.Now()
	const commits = 20
	for i := range commits {
		enqueue(t, pool, newEvent(fmt.Sprintf("agg-%d", i), 1))
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("commit %d to be published", i+1), func() (bool, error) {
			return c.Distinct() == i+2, nil
		})
	}
	d := counts.Snapshot().Minus(before)
	took := time.Since(start)
	// Retention and the record may each run once per RetentionInterval
	// (its default, 5s).
	allowed := 2 * (1 + int64(took/(5*time.Second)))
	t.Logf("%d commits in %v: %d statements on the relay's pool (allowed %d)", commits, took.Round(time.Millisecond), d.Statements, allowed)
	if d.Statements > allowed {
		t.Errorf("%d statements for %d commits in %v, want at most %d: the relay pays a statement per commit",
			d.Statements, commits, took.Round(time.Millisecond), allowed)
	}
}
