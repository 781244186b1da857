package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// inSavepoint reports whether the handler was given a savepoint (the
// per-message path) rather than the batch's own transaction (the fast path).
func inSavepoint(tx pgx.Tx) bool { return strings.Contains(fmt.Sprintf("%T", tx), "Nested") }

// A pre-filled partition reaches one worker as large batches; the fast path
// must give each message exactly the outcome the per-message path would.
func TestABatchSettlesDuplicatesStaleGapsAndAFailureLikeOneByOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a1, a2, b1, c1, d1, d3 := inboxtesting.NewEvent("a", 1), inboxtesting.NewEvent("a", 2), inboxtesting.NewEvent("b", 1), inboxtesting.NewEvent("c", 1), inboxtesting.NewEvent("d", 1), inboxtesting.NewEvent("d", 3)
	staleA := inboxtesting.NewEvent("a", 1) // an old version under a new id
	clean := make([]event.Envelope, 20)
	for i := range clean {
		clean[i] = inboxtesting.NewEvent(fmt.Sprintf("clean-%d", i), 1)
	}
	// Phase one has no failures, so it must settle entirely on the fast
	// path; phase two's c fails twice, so its batch falls back.
	var phase1, phase2 []kafka.Message
	for _, ev := range append(clean, a1, a1, a2, a1, b1, staleA, d1, d3) {
		phase1 = append(phase1, event.ToKafka(f.Topic, ev))
	}
	for _, ev := range []event.Envelope{c1, inboxtesting.NewEvent("e", 1)} {
		phase2 = append(phase2, event.ToKafka(f.Topic, ev))
	}
	f.Produce(t, phase1...)

	var (
		mu            sync.Mutex
		cFailures     int
		fastCalls     int
		fastSeen      = map[string]bool{} // by event id: a fallback handles one message on both paths
		fastFailures  int
		savepointSeen = map[string]bool{} // by aggregate id (c must reach it) and by event id
	)
	f.run(t, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		mu.Lock()
		if inSavepoint(tx) {
			savepointSeen[ev.AggregateID] = true
			savepointSeen[ev.EventID.String()] = true
		} else {
			fastCalls++
			fastSeen[ev.EventID.String()] = true
		}
		fail := ev.AggregateID == "c" && cFailures < 2
		if fail {
			cFailures++
			if !inSavepoint(tx) {
				fastFailures++ // rolled back and retried per message; not counted
			}
		}
		mu.Unlock()
		if fail {
			return errors.New("c is not ready yet")
		}
		return f.recordEffect(ctx, tx, ev)
	}, inbox.Config{Workers: 1, BatchSize: 100, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		AcceptGaps: true, SkipStale: true}) // the opt-ins, whose outcomes the fast path must match

	settled := func(n int) func() (bool, error) {
		return func() (bool, error) {
			return testenv.MetricValue(t, f.Registry, "inbox_processed_total")+
				testenv.MetricValue(t, f.Registry, "inbox_duplicates_total")+
				testenv.MetricValue(t, f.Registry, "inbox_stale_total") == float64(n), nil
		}
	}
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("phase one's %d messages to settle", len(phase1)), settled(len(phase1)))
	mu.Lock()
	// A batch of one message takes the per-message path directly (a fetch
	// that happened to end just before d/3 hands it over alone, after d/1
	// went on the fast path: not a fallback); a fallback shows as the same
	// message handled on both paths.
	for id := range fastSeen {
		if savepointSeen[id] {
			t.Errorf("phase one has no failures, yet event %s was handled on the fast path and again in a savepoint: the fast path fell back", id)
		}
	}
	mu.Unlock()
	f.Produce(t, phase2...)
	testenv.WaitFor(t, 30*time.Second, "phase two to settle", settled(len(phase1)+len(phase2)))
	for metric, want := range map[string]float64{
		"inbox_processed_total":    float64(len(clean)) + 7, // a1 a2 b1 d1 d3, then c1 e1
		"inbox_duplicates_total":   2,
		"inbox_stale_total":        1,
		"inbox_version_gaps_total": 1, // d: 1 then 3
	} {
		if got := testenv.MetricValue(t, f.Registry, metric); got != want {
			t.Errorf("%s = %v, want %v", metric, got, want)
		}
	}
	for agg, want := range map[string]int{"a": 2, "b": 1, "c": 1, "d": 2, "e": 1, "clean-7": 1} {
		if n := f.Count(t, "SELECT count(*) FROM effects WHERE aggregate_id = $1", agg); n != want {
			t.Errorf("aggregate %s has %d effects, want %d", agg, n, want)
		}
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'stale' AND message_id = $1", staleA.EventID); n != 1 {
		t.Error("the stale event's inbox row is not marked stale")
	}
	if n := f.Count(t, "SELECT count(*) FROM inbox_aggregate_versions WHERE aggregate_id = 'a' AND version = 2"); n != 1 {
		t.Error("aggregate a's applied version is not 2")
	}
	mu.Lock()
	defer mu.Unlock()
	if got, want := testenv.MetricValue(t, f.Registry, "inbox_failures_total"), float64(cFailures-fastFailures); got != want {
		t.Errorf("inbox_failures_total = %v, want %v (c's failures on the per-message path)", got, want)
	}
	if fastCalls == 0 {
		t.Error("no handler call ran on the fast path: every batch fell back to savepoints")
	}
	if !savepointSeen["c"] {
		t.Error("the failing message was never retried on the per-message path")
	}
}
