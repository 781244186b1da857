package interleave_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/interleave"
)

func TestCountIsTheMultinomial(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		counts []int
		want   int64
	}{
		{[]int{1}, 1},
		{[]int{2, 2}, 6},
		{[]int{3, 3, 3}, 1680},
		{[]int{4, 2, 1}, 105},
	} {
		if got := interleave.Count(tc.counts); got.Int64() != tc.want {
			t.Errorf("Count(%v) = %s, want %d", tc.counts, got, tc.want)
		}
	}
}

func TestOrderingsYieldsEveryInterleavingOnce(t *testing.T) {
	t.Parallel()
	counts := []int{3, 2, 2}
	seen := map[string]bool{}
	interleave.Orderings(counts, func(order []int) bool {
		key := fmt.Sprint(order)
		if seen[key] {
			t.Errorf("ordering %v yielded twice", order)
		}
		seen[key] = true
		checkMultiset(t, counts, order)
		return true
	})
	if want := interleave.Count(counts).Int64(); int64(len(seen)) != want {
		t.Errorf("yielded %d orderings, want %d", len(seen), want)
	}
}

func TestRandomOrderingKeepsEachActorsStepCount(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		checkMultiset(t, []int{3, 1, 4}, interleave.RandomOrdering([]int{3, 1, 4}, rng))
	}
}

func checkMultiset(t *testing.T, counts, order []int) {
	t.Helper()
	got := make([]int, len(counts))
	for _, a := range order {
		got[a]++
	}
	if fmt.Sprint(got) != fmt.Sprint(counts) {
		t.Errorf("ordering %v has step counts %v, want %v", order, got, counts)
	}
}

// recorder stands in for t where a test expects Explore to fail.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Logf(string, ...any) {}

// lostUpdate is the classic race: two actors read a counter, then write what
// they read plus one. Only some interleavings lose an increment: the checker
// must find one, print it, and pass the guarded version.
func lostUpdate(guarded bool) func(testing.TB) interleave.World {
	return func(testing.TB) interleave.World {
		var mu sync.Mutex
		counter := 0
		actor := func(name string) interleave.Actor {
			var read int
			return interleave.Actor{Name: name, Steps: []interleave.Step{
				{Name: "read", Run: func(context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					read = counter
					return nil
				}},
				{Name: "write", Run: func(context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					if guarded && counter != read { // the expected state, named
						read = counter
					}
					counter = read + 1
					return nil
				}},
			}}
		}
		return interleave.World{
			Actors: []interleave.Actor{actor("A"), actor("B")},
			Final: func(context.Context) error {
				if counter != 2 {
					return fmt.Errorf("counter = %d, want 2 (an increment lost)", counter)
				}
				return nil
			},
		}
	}
}

func TestExploreFindsALostUpdateAndPrintsItsSchedule(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	res := interleave.Explore(r, lostUpdate(false), interleave.Options{})
	if len(r.errors) != 1 {
		t.Fatalf("Explore reported %d failures, want the first one: %q", len(r.errors), r.errors)
	}
	// It stopped there, and its summary must not claim it ran them all.
	if !res.Failed || strings.Contains(res.String(), "every interleaving") {
		t.Errorf("summary %q (failed %v): want it to say it stopped at the failing schedule", res, res.Failed)
	}
	msg := r.errors[0]
	for _, want := range []string{"counter = 1", "A.read → B.read", "INTERLEAVE_SCHEDULE='A.read B.read"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q does not say %q", msg, want)
		}
	}
}

func TestExplorePassesTheGuardedVersionOverEveryInterleaving(t *testing.T) {
	t.Parallel()
	res := interleave.Explore(t, lostUpdate(true), interleave.Options{})
	if !res.Exhaustive || res.Schedules != 6 {
		t.Errorf("ran %s, want all 6 interleavings", res)
	}
}

func TestExploreGoesOnPastABlockedStepAndCollectsIt(t *testing.T) {
	t.Parallel()
	// A holds a lock across two steps; B's step waits for it. In the
	// schedules where B runs between A's steps, B must be seen blocked and
	// collected after A releases, not deadlock the schedule.
	res := interleave.Explore(t, func(testing.TB) interleave.World {
		var lock sync.Mutex
		order := []string{}
		var omu sync.Mutex
		note := func(s string) { omu.Lock(); order = append(order, s); omu.Unlock() }
		return interleave.World{
			Actors: []interleave.Actor{
				{Name: "A", Steps: []interleave.Step{
					{Name: "lock", Run: func(context.Context) error { lock.Lock(); note("A.lock"); return nil }},
					{Name: "unlock", Run: func(context.Context) error { note("A.unlock"); lock.Unlock(); return nil }},
				}},
				{Name: "B", Steps: []interleave.Step{
					{Name: "take", Run: func(context.Context) error { lock.Lock(); note("B.take"); lock.Unlock(); return nil }},
				}},
			},
			Final: func(context.Context) error {
				omu.Lock()
				defer omu.Unlock()
				if len(order) != 3 {
					return fmt.Errorf("ran %v", order)
				}
				return nil
			},
		}
	}, interleave.Options{BlockAfter: 50 * time.Millisecond, StepTimeout: 5 * time.Second})
	if res.Schedules != 3 {
		t.Errorf("ran %s, want 3", res)
	}
}

func TestExploreReplaysOneScheduleFromTheEnvironment(t *testing.T) {
	t.Setenv("INTERLEAVE_SCHEDULE", "B.read A.read A.write B.write")
	r := &recorder{TB: t}
	res := interleave.Explore(r, lostUpdate(false), interleave.Options{})
	if res.Schedules != 1 || len(r.errors) != 1 || !strings.Contains(r.errors[0], "B.read → A.read → A.write → B.write") {
		t.Errorf("replay ran %d schedules with failures %q, want the one named", res.Schedules, r.errors)
	}
}

func TestExploreSamplesWhenThereAreTooManyInterleavings(t *testing.T) {
	t.Parallel()
	res := interleave.Explore(t, lostUpdate(true), interleave.Options{Exhaustive: 2, Random: 5, Seed: 7})
	if res.Exhaustive || res.Schedules != 5 || res.Seed != 7 {
		t.Errorf("ran %s, want 5 random schedules of seed 7", res)
	}
}
