// Package interleave explores the interleavings of a few actors that touch the
// same rows: two workers across a rebalance, a late dead-letter writer, an
// operator, the pruner, a second relay. Each actor is a sequence of the
// library's real steps; Explore runs every ordering of those steps up to a
// bound — and seeded random orderings beyond it — each against a fresh world
// (a fresh database), and checks the world's invariants after every step and
// at the end.
//
// It is the inbox's and the outbox's model checker, in the spirit of
// TigerBeetle's VOPR and FoundationDB's simulation, but on the real Postgres
// instead of a model of it: the steps are the statements the library runs,
// so the checker cannot drift from the code it checks.
//
// A step may block on a row lock another actor holds (an open transaction):
// the explorer waits BlockAfter for it, then lets the schedule go on with
// the other actors and collects the blocked step before that actor's next
// one. The schedule stays a real interleaving; the printed schedule says
// which steps ran blocked.
//
// A failing schedule is printed step by step, with the environment setting
// that replays it alone:
//
//	INTERLEAVE_SCHEDULE='A.claim B.claim A.commit B.commit' go test -run TestX
package interleave

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// Step is one of an actor's real steps: a statement, a transaction, a call.
type Step struct {
	// Name is short and unique within the actor (it is printed as Actor.Name).
	Name string
	// Run takes the step. An error fails the schedule: steps that may be
	// refused (a late writer that changes nothing) report that as a result,
	// not as an error.
	Run func(ctx context.Context) error
}

// Actor is one participant: its steps run in order, interleaved with the
// other actors' steps.
type Actor struct {
	Name  string
	Steps []Step
}

// World is one fresh instance of the system under test, for one schedule.
type World struct {
	Actors []Actor
	// Check, when set, holds after every step (it reads committed state;
	// a step still blocked may be half done).
	Check func(ctx context.Context) error
	// Final, when set, holds once every actor has run every step: the
	// eventual properties (every event ends processed, or dead and visible).
	Final func(ctx context.Context) error
	// Close, when set, releases the world (connections, transactions left
	// open by a failed schedule).
	Close func()
}

// Options bounds the exploration.
type Options struct {
	// Exhaustive is the most schedules run one by one: when the actors'
	// steps have at most this many orderings, all of them run. Default 2000.
	Exhaustive int
	// Random is how many seeded random orderings run when there are more.
	// Default 200.
	Random int
	// Seed seeds the random orderings; INTERLEAVE_SEED overrides it.
	// Default: the time.
	Seed uint64
	// BlockAfter is how long a step may take before the explorer treats it
	// as blocked and goes on with the other actors. Default 300ms.
	BlockAfter time.Duration
	// StepTimeout fails a schedule whose blocked step never finishes (a
	// deadlock between steps). Default 30s.
	StepTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Exhaustive == 0 {
		o.Exhaustive = 2000
	}
	if o.Random == 0 {
		o.Random = 200
	}
	if o.BlockAfter == 0 {
		o.BlockAfter = 300 * time.Millisecond
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 30 * time.Second
	}
	return o
}

// Result says what an exploration covered.
type Result struct {
	Schedules  int  // how many ran
	Exhaustive bool // every ordering ran
	Total      *big.Int
	Seed       uint64 // the seed of the random orderings, when not exhaustive
	Failed     bool   // a schedule failed: the exploration stopped there
}

func (r Result) String() string {
	if r.Failed {
		return fmt.Sprintf("stopped at the first failing schedule, %d run of %s", r.Schedules, r.Total)
	}
	if r.Exhaustive {
		return fmt.Sprintf("%d schedules (every interleaving)", r.Schedules)
	}
	return fmt.Sprintf("%d seeded random schedules of %s (INTERLEAVE_SEED=%d)", r.Schedules, r.Total, r.Seed)
}

// Explore runs the orderings of the actors that newWorld builds and fails t
// with the first schedule that breaks an invariant. newWorld is called once
// per schedule and must return actors with the same names and step counts
// every time.
func Explore(t testing.TB, newWorld func(t testing.TB) World, opts Options) Result {
	t.Helper()
	opts = opts.withDefaults()
	if env := os.Getenv("INTERLEAVE_SEED"); env != "" {
		if _, err := fmt.Sscan(env, &opts.Seed); err != nil {
			t.Fatalf("INTERLEAVE_SEED=%q: %v", env, err)
		}
	}
	if opts.Seed == 0 {
		opts.Seed = uint64(time.Now().UnixNano())
	}

	probe := newWorld(t)
	counts := make([]int, len(probe.Actors))
	names := make([]string, len(probe.Actors))
	for i, a := range probe.Actors {
		counts[i], names[i] = len(a.Steps), a.Name
	}
	if probe.Close != nil {
		probe.Close()
	}

	if env := os.Getenv("INTERLEAVE_SCHEDULE"); env != "" {
		order, err := parseSchedule(env, probe.Actors)
		if err != nil {
			t.Fatalf("INTERLEAVE_SCHEDULE: %v", err)
		}
		runOne(t, newWorld, order, opts)
		return Result{Schedules: 1, Exhaustive: false, Total: Count(counts)}
	}

	total := Count(counts)
	res := Result{Total: total}
	if total.IsInt64() && total.Int64() <= int64(opts.Exhaustive) {
		res.Exhaustive = true
		Orderings(counts, func(order []int) bool {
			res.Schedules++
			res.Failed = !runOne(t, newWorld, order, opts)
			return !res.Failed
		})
	} else {
		res.Seed = opts.Seed
		rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))
		for i := 0; i < opts.Random; i++ {
			res.Schedules++
			if res.Failed = !runOne(t, newWorld, RandomOrdering(counts, rng), opts); res.Failed {
				break
			}
		}
	}
	t.Logf("interleave: %s, actors %s", res, describeActors(names, counts))
	return res
}

func describeActors(names []string, counts []int) string {
	parts := make([]string, len(names))
	for i := range names {
		parts[i] = fmt.Sprintf("%s×%d", names[i], counts[i])
	}
	return strings.Join(parts, " ")
}

// Count is the number of interleavings of actors with these step counts: the
// multinomial coefficient (Σn)! / Πn!.
func Count(counts []int) *big.Int {
	total := big.NewInt(1)
	n := 0
	for _, c := range counts {
		for k := 1; k <= c; k++ {
			n++
			total.Mul(total, big.NewInt(int64(n)))
			total.Div(total, big.NewInt(int64(k)))
		}
	}
	return total
}

// Orderings calls yield with every interleaving of actors with these step
// counts, as the actor index of each step in turn, until yield returns false.
func Orderings(counts []int, yield func(order []int) bool) {
	left := append([]int(nil), counts...)
	n := 0
	for _, c := range counts {
		n += c
	}
	order := make([]int, 0, n)
	var rec func() bool
	rec = func() bool {
		if len(order) == n {
			return yield(append([]int(nil), order...))
		}
		for a := range left {
			if left[a] == 0 {
				continue
			}
			left[a]--
			order = append(order, a)
			ok := rec()
			order = order[:len(order)-1]
			left[a]++
			if !ok {
				return false
			}
		}
		return true
	}
	rec()
}

// RandomOrdering draws one interleaving uniformly: a shuffle of the multiset
// of actor indices.
func RandomOrdering(counts []int, rng *rand.Rand) []int {
	var order []int
	for a, c := range counts {
		for range c {
			order = append(order, a)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	return order
}

func parseSchedule(s string, actors []Actor) ([]int, error) {
	index := map[string]int{}
	for i, a := range actors {
		index[a.Name] = i
	}
	var order []int
	next := make([]int, len(actors))
	for _, f := range strings.Fields(s) {
		name, step, _ := strings.Cut(strings.TrimSuffix(f, "(blocked)"), ".")
		a, ok := index[name]
		if !ok {
			return nil, fmt.Errorf("no actor %q", name)
		}
		if next[a] >= len(actors[a].Steps) || actors[a].Steps[next[a]].Name != step {
			return nil, fmt.Errorf("%s: actor %s has no step %q next", f, name, step)
		}
		next[a]++
		order = append(order, a)
	}
	for a, n := range next {
		if n != len(actors[a].Steps) {
			return nil, fmt.Errorf("actor %s: schedule names %d of its %d steps", actors[a].Name, n, len(actors[a].Steps))
		}
	}
	return order, nil
}

type stepDone struct{ err error }

// runOne runs one schedule in a fresh world; it reports false (and fails t)
// when an invariant broke.
func runOne(t testing.TB, newWorld func(t testing.TB) World, order []int, opts Options) bool {
	t.Helper()
	w := newWorld(t)
	if w.Close != nil {
		defer w.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	next := make([]int, len(w.Actors))
	pending := make([]chan stepDone, len(w.Actors)) // a step still running, by actor
	var trace []string

	fail := func(format string, args ...any) bool {
		t.Helper()
		t.Errorf("interleave: %s\nschedule: %s\nreplay it alone: INTERLEAVE_SCHEDULE='%s'",
			fmt.Sprintf(format, args...), strings.Join(trace, " → "), replayString(w.Actors, order))
		return false
	}
	collect := func(a int) (error, bool) {
		if pending[a] == nil {
			return nil, true
		}
		select {
		case d := <-pending[a]:
			pending[a] = nil
			return d.err, true
		case <-time.After(opts.StepTimeout):
			return nil, false
		}
	}

	for _, a := range order {
		actor := w.Actors[a]
		if err, ok := collect(a); !ok {
			return fail("%s: a blocked step did not finish within %s (deadlock?)", actor.Name, opts.StepTimeout)
		} else if err != nil {
			return fail("%s: %v", actor.Name, err)
		}
		step := actor.Steps[next[a]]
		next[a]++
		done := make(chan stepDone, 1)
		go func() { done <- stepDone{err: step.Run(ctx)} }()
		label := actor.Name + "." + step.Name
		select {
		case d := <-done:
			trace = append(trace, label)
			if d.err != nil {
				return fail("%s: %v", label, d.err)
			}
		case <-time.After(opts.BlockAfter):
			trace = append(trace, label+"(blocked)")
			pending[a] = done
		}
		if w.Check != nil {
			if err := w.Check(ctx); err != nil {
				return fail("after %s: %v", label, err)
			}
		}
	}
	for a := range w.Actors {
		if err, ok := collect(a); !ok {
			return fail("%s: a blocked step did not finish within %s (deadlock?)", w.Actors[a].Name, opts.StepTimeout)
		} else if err != nil {
			return fail("%s: %v", w.Actors[a].Name, err)
		}
	}
	if w.Check != nil {
		if err := w.Check(ctx); err != nil {
			return fail("at the end: %v", err)
		}
	}
	if w.Final != nil {
		if err := w.Final(ctx); err != nil {
			return fail("final: %v", err)
		}
	}
	return true
}

func replayString(actors []Actor, order []int) string {
	next := make([]int, len(actors))
	parts := make([]string, len(order))
	for i, a := range order {
		parts[i] = actors[a].Name + "." + actors[a].Steps[next[a]].Name
		next[a]++
	}
	return strings.Join(parts, " ")
}
