package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// booker is a third party that cannot dedupe: every Call books, and Check
// says whether a key was booked. It records what the lease tests assert:
// bookings per key, the order of each aggregate's calls, and how many calls
// overlapped.
type booker struct {
	delay time.Duration // each call takes this long

	mu       sync.Mutex
	booked   map[string]int     // idempotency key -> bookings
	versions map[string][]int64 // aggregate id -> versions, in call order
	checks   int

	inFlight, maxInFlight atomic.Int32
}

func newBooker(delay time.Duration) *booker {
	return &booker{delay: delay, booked: map[string]int{}, versions: map[string][]int64{}}
}

func (b *booker) effect() lease.Effect {
	return lease.Effect{
		Check: func(_ context.Context, key string) (bool, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.checks++
			return b.booked[key] > 0, nil
		},
		Call: func(ctx context.Context, ev event.Envelope, key string) error {
			n := b.inFlight.Add(1)
			defer b.inFlight.Add(-1)
			for {
				top := b.maxInFlight.Load()
				if n <= top || b.maxInFlight.CompareAndSwap(top, n) {
					break
				}
			}
			select {
			case <-time.After(b.delay):
			case <-ctx.Done():
				return ctx.Err()
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			b.booked[key]++
			b.versions[ev.AggregateID] = append(b.versions[ev.AggregateID], ev.AggregateVersion)
			return nil
		},
		Done: func(ctx context.Context, tx pgx.Tx, ev event.Envelope, outcome lease.Outcome) error {
			_, err := tx.Exec(ctx, `INSERT INTO lease_outcomes (event_id, outcome) VALUES ($1, $2)`, ev.EventID, string(outcome))
			return err
		},
	}
}

func (b *booker) bookings(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.booked[key]
}

// leaseEvents produces versions 1..perKey of keys aggregates, interleaved
// (k0 v1, k1 v1, …, k0 v2, …) on the fixture's one partition, and returns
// them in that order.
func (f *fixture) leaseEvents(t *testing.T, keys, perKey int) []event.Envelope {
	t.Helper()
	if _, err := f.Pool.Exec(context.Background(),
		`CREATE TABLE IF NOT EXISTS lease_outcomes (event_id uuid PRIMARY KEY, outcome text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var evs []event.Envelope
	var msgs []kafka.Message
	for v := 1; v <= perKey; v++ {
		for k := range keys {
			ev := inboxtesting.NewEvent(fmt.Sprintf("k%d", k), int64(v))
			evs = append(evs, ev)
			msgs = append(msgs, event.ToKafka(f.Topic, ev))
		}
	}
	f.Produce(t, msgs...)
	return evs
}

func (f *fixture) leaseConsumer(t *testing.T, group string, eff lease.Effect, cfg lease.Config) *inbox.Consumer {
	t.Helper()
	cfg.Name = "lease-test"
	c, err := lease.NewConsumer(f.Pool, f.Source(group), f.Writer, eff, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runUntilKilledAfterEffect runs c until a side effect returns after which
// kill (given how many have returned so far, this one included) says to
// die, and kills c there, before the call is marked done, as a killed
// process would die; it fails the test unless Run ended with that death,
// within a minute.
func runUntilKilledAfterEffect(t *testing.T, c *inbox.Consumer, kill func(calls int32) bool) {
	t.Helper()
	killed := errors.New("killed")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var calls atomic.Int32
	crashPoint := inboxtest.WithCrashPoint(ctx, func(name string) error {
		if name == inboxtest.CrashAfterEffect && kill(calls.Add(1)) {
			return killed
		}
		return nil
	})
	if err := c.Run(crashPoint); !errors.Is(err, killed) {
		t.Fatalf("first life ended with %v, want the crash", err)
	}
}

func TestALeaseBatchCallsDistinctKeysConcurrentlyAndEachKeyInOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const keys, perKey, limit = 8, 5, 4
	evs := f.leaseEvents(t, keys, perKey)
	b := newBooker(20 * time.Millisecond)
	// One worker: whatever runs at once runs because the batch called
	// distinct keys side by side.
	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, testenv.Name("group"), b.effect(), lease.Config{Config: inbox.Config{Workers: 1}, MaxInFlight: limit}))

	testenv.WaitFor(t, 60*time.Second, "every event marked done", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == len(evs), nil
	})
	for _, ev := range evs {
		if n := b.bookings(ev.EventID.String()); n != 1 {
			t.Errorf("event %s (%s v%d) booked %d times, want once", ev.EventID, ev.AggregateID, ev.AggregateVersion, n)
		}
	}
	b.mu.Lock()
	for k := range keys {
		got := b.versions[fmt.Sprintf("k%d", k)]
		if !slices.IsSorted(got) || len(got) != perKey {
			t.Errorf("k%d was called for versions %v, want 1..%d in order", k, got, perKey)
		}
	}
	b.mu.Unlock()
	if got := b.maxInFlight.Load(); got < 2 || got > limit {
		t.Fatalf("at most %d calls ran at once, want 2..%d (distinct keys concurrently, within MaxInFlight)", got, limit)
	}
	if n := f.Count(t, "SELECT count(*) FROM lease_outcomes WHERE outcome = 'sent'"); n != len(evs) {
		t.Fatalf("%d outcomes recorded as sent, want %d", n, len(evs))
	}
	t.Logf("%d events of %d keys, one worker: up to %d calls at once", len(evs), keys, b.maxInFlight.Load())
}

func TestAfterACrashBetweenCallsAndDoneTheTakeoverChecksAndBooksNothingTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 6, 3)
	b := newBooker(5 * time.Millisecond)
	group := testenv.Name("group")

	// First life: dies at the fifth side effect, before its batch is marked done.
	first := f.leaseConsumer(t, group, b.effect(), lease.Config{LeaseTTL: time.Second, Config: inbox.Config{Workers: 1}})
	runUntilKilledAfterEffect(t, first, func(calls int32) bool { return calls == 5 })
	// The ones booked and left leased: the takeover must find them booked.
	var orphans []event.Envelope
	for _, ev := range evs {
		if b.bookings(ev.EventID.String()) > 0 && f.Count(t,
			"SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status = 'leased'", ev.EventID) == 1 {
			orphans = append(orphans, ev)
		}
	}
	if len(orphans) == 0 {
		t.Fatal("the crash left no booked message leased; the test proves nothing")
	}

	second := f.leaseConsumer(t, group, b.effect(), lease.Config{Config: inbox.Config{Workers: 1}, LeaseTTL: time.Second})
	inboxtesting.RunUntilCleanup(t, second)
	testenv.WaitFor(t, 60*time.Second, "every event marked done", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == len(evs), nil
	})
	for _, ev := range evs {
		if n := b.bookings(ev.EventID.String()); n != 1 {
			t.Errorf("event %s (%s v%d) booked %d times, want once", ev.EventID, ev.AggregateID, ev.AggregateVersion, n)
		}
	}
	for _, ev := range orphans {
		var outcome string
		if err := f.Pool.QueryRow(context.Background(), "SELECT outcome FROM lease_outcomes WHERE event_id = $1", ev.EventID).Scan(&outcome); err != nil {
			t.Fatal(err)
		}
		if outcome != string(lease.AlreadyPresent) {
			t.Errorf("event %s booked before the crash: outcome %q, want already_present", ev.EventID, outcome)
		}
	}
	b.mu.Lock()
	checks := b.checks
	b.mu.Unlock()
	if checks < len(orphans) {
		t.Fatalf("%d checks for %d taken-over leases: a takeover called without asking", checks, len(orphans))
	}
	t.Logf("%d of %d events were booked and left leased by the crash; all found by the check", len(orphans), len(evs))
}

func TestATakeoverThatCannotCheckIsRecordedUncertainAndNotCalled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 3, 1)
	b := newBooker(5 * time.Millisecond)
	group := testenv.Name("group")

	first := f.leaseConsumer(t, group, b.effect(), lease.Config{LeaseTTL: 500 * time.Millisecond, Config: inbox.Config{Workers: 1}})
	runUntilKilledAfterEffect(t, first, func(int32) bool { return true })

	// Second life: the third party cannot say whether it has the key.
	eff := b.effect()
	eff.Check = func(context.Context, string) (bool, error) { return false, lease.ErrUnknowable }
	cfg := lease.Config{Config: inbox.Config{Workers: 1, Metrics: inbox.NewMetrics(f.Registry)}, LeaseTTL: 500 * time.Millisecond}
	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, group, eff, cfg))
	testenv.WaitFor(t, 60*time.Second, "every event settled", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status IN ('processed', 'uncertain')") == len(evs), nil
	})
	uncertain := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'uncertain'")
	if uncertain == 0 {
		t.Fatal("no message recorded uncertain, though the crash left at least one called and leased")
	}
	for _, ev := range evs {
		if n := b.bookings(ev.EventID.String()); n > 1 {
			t.Errorf("event %s booked %d times", ev.EventID, n)
		}
	}
	if got := testenv.MetricValue(t, f.Registry, "inbox_uncertain_total"); got != float64(uncertain) {
		t.Fatalf("inbox_uncertain_total = %v, want %d", got, uncertain)
	}
}

// An Effect with DoneBatch records a batch's outcomes in one call, in the
// transaction that marks them done; an Effect with Done and DoneBatch is
// refused.
func TestDoneBatchRecordsABatchsOutcomesInOneCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 8, 1)
	b := newBooker(0)
	eff := b.effect()
	if _, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, eff,
		lease.Config{Config: inbox.Config{Name: "both"}}); err != nil {
		t.Fatal(err)
	}
	eff.DoneBatch = func(ctx context.Context, tx pgx.Tx, done []lease.DoneEvent) error { return nil }
	if _, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, eff,
		lease.Config{Config: inbox.Config{Name: "both"}}); err == nil {
		t.Fatal("an Effect with Done and DoneBatch was accepted")
	}
	var (
		mu    sync.Mutex
		sizes []int
	)
	eff.Done = nil
	eff.DoneBatch = func(ctx context.Context, tx pgx.Tx, done []lease.DoneEvent) error {
		ids, outcomes := make([][16]byte, len(done)), make([]string, len(done))
		for i, d := range done {
			ids[i], outcomes[i] = d.Event.EventID, string(d.Outcome)
		}
		mu.Lock()
		sizes = append(sizes, len(done))
		mu.Unlock()
		_, err := tx.Exec(ctx, `INSERT INTO lease_outcomes SELECT * FROM unnest($1::uuid[], $2::text[])`, ids, outcomes)
		return err
	}
	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, testenv.Name("group"), eff, lease.Config{Config: inbox.Config{Workers: 1}}))
	testenv.WaitFor(t, 60*time.Second, "every outcome recorded", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM lease_outcomes WHERE outcome = 'sent'") == len(evs), nil
	})
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"); n != len(evs) {
		t.Fatalf("%d messages marked done, want %d", n, len(evs))
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Max(sizes) < 2 {
		t.Fatalf("DoneBatch was called with %v events at a time: never a batch", sizes)
	}
}
