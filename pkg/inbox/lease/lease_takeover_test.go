package lease_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/lease/leasetest"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// secondMember runs a second member of the lease-mode consumer (the same
// consumer Name, so the same inbox rows and leases) with the same messages
// in hand as the first: what a rebalance leaves behind while the old holder
// is still working on what it fetched (slow, frozen, or in its drain
// window) and the new owner of the partition fetches the same messages.
// It reads the topic in a group of its own, so that it has them at once
// whatever the group's assignment says: the two members then meet only
// where the bugs live, at the leases.
func (f *fixture) secondMember(t *testing.T, eff lease.Effect, cfg lease.Config) {
	t.Helper()
	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, testenv.Name("second"), eff, cfg))
}

// requireBookedOnce waits until the third party has nothing in flight and
// every event is marked done, then fails the test for each event it booked
// other than once.
func requireBookedOnce(t *testing.T, f *fixture, tp *leasetest.ThirdParty, evs []event.Envelope) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, "every event marked done, and no call left in flight", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == len(evs) && tp.InFlight() == 0, nil
	})
	for _, ev := range evs {
		if n := tp.Bookings(ev.EventID.String()); n != 1 {
			t.Errorf("event %s (%s v%d) booked %d times, want once", ev.EventID, ev.AggregateID, ev.AggregateVersion, n)
		}
	}
}

// The schedule of issue 19: one call slot, calls of 700ms, leases of 1s. The
// first member leases four keys and calls them one after the other; the
// leases of those waiting for the slot expire; the second member takes them
// over, checks (nothing booked yet) and calls. The first member must not call
// them too once it gets the slot.
func TestLeaseTakeoverWhileTheHolderWaitsForACallSlotBooksEachKeyOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 4, 1)
	tp := leasetest.NewThirdParty()
	tp.SetDelay(700 * time.Millisecond)
	// Calls of 700ms fit in the call timeout; the lease outlasts call and
	// margin.
	cfg := lease.Config{MaxInFlight: 1, LeaseTTL: time.Second,
		CallTimeout: 750 * time.Millisecond, LeaseMargin: 200 * time.Millisecond,
		Config: inbox.Config{Workers: 1, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}}

	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, testenv.Name("group"), tp.Effect(), cfg))
	testenv.WaitFor(t, 30*time.Second, "the first member's first call", func() (bool, error) {
		return tp.Received() >= 1, nil
	})
	f.secondMember(t, tp.Effect(), cfg)
	requireBookedOnce(t, f, tp, evs)
}

// A member frozen while it holds a lease (here: right before its call
// reaches the third party) outlives its lease; the second member takes the
// key's two messages over and books them. When the first one wakes up, its
// call must not book the first message again, and it must not go on to the
// second.
func TestLeaseHolderFrozenPastItsLeaseDoesNotCallAfterTheTakeover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 1, 2)
	tp := leasetest.NewThirdParty()
	cfg := lease.Config{LeaseTTL: time.Second,
		Config: inbox.Config{Workers: 1, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}}

	frozen := leasetest.NewPausable(tp.Effect())
	frozen.Pause()
	inboxtesting.RunUntilCleanup(t, f.leaseConsumer(t, testenv.Name("group"), frozen.Effect(), cfg))
	testenv.WaitFor(t, 30*time.Second, "the first member to freeze on its call", func() (bool, error) {
		return frozen.Waiting() == 1, nil
	})
	f.secondMember(t, tp.Effect(), cfg)
	testenv.WaitFor(t, 30*time.Second, "the second member to take the messages over and book them", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == len(evs), nil
	})
	frozen.Resume()
	testenv.WaitFor(t, 30*time.Second, "the first member's call to return", func() (bool, error) {
		return frozen.Released() >= 1, nil
	})
	requireBookedOnce(t, f, tp, evs)
	requireBookedInOrder(t, tp, evs)
}

// requireBookedInOrder fails the test unless the third party booked evs in
// the order given (each key's versions in order).
func requireBookedInOrder(t *testing.T, tp *leasetest.ThirdParty, evs []event.Envelope) {
	t.Helper()
	want := map[string][]string{}
	of := map[string]string{}
	for _, ev := range evs {
		want[ev.AggregateID] = append(want[ev.AggregateID], ev.EventID.String())
		of[ev.EventID.String()] = ev.AggregateID
	}
	got := map[string][]string{}
	for _, key := range tp.Booked() {
		got[of[key]] = append(got[of[key]], key)
	}
	for agg, ids := range want {
		if !slices.Equal(got[agg], ids) {
			t.Errorf("%s booked as %v, want %v (versions in order)", agg, got[agg], ids)
		}
	}
}

// A third party that is down far longer than the retry budget is an outage:
// the consumer waits it out, charges no attempt, dead-letters nothing, says
// so in its metrics and Healthy, and books everything once, in order, when
// the third party is back.
func TestLeaseModeWaitsOutAThirdPartyOutageLongerThanTheRetryBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 3, 2)
	tp := leasetest.NewThirdParty()
	tp.SetDown(fmt.Errorf("%w: dial tcp: connection refused", lease.ErrUnavailable))
	cfg := lease.Config{LeaseTTL: time.Second, Config: inbox.Config{Workers: 1, MaxAttempts: 2,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond, Metrics: inbox.NewMetrics(f.Registry)}}
	c := f.leaseConsumer(t, testenv.Name("group"), tp.Effect(), cfg)
	running := inboxtesting.RunUntilCleanup(t, c)

	testenv.WaitFor(t, 30*time.Second, "ten times the retry budget of failed calls and checks", func() (bool, error) {
		return testenv.MetricValue(t, f.Registry, "inbox_effect_errors_total") >= float64(10*cfg.MaxAttempts*len(evs)), running()
	})
	if n := f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'dead_lettered'"); n != 0 {
		t.Fatalf("%d messages dead-lettered by an outage of the third party", n)
	}
	if got := testenv.MetricValue(t, f.Registry, "inbox_failures_total"); got != 0 {
		t.Errorf("inbox_failures_total = %v: the outage was charged to the messages", got)
	}
	if got := testenv.MetricValue(t, f.Registry, "inbox_effect_connected"); got != 0 {
		t.Errorf("inbox_effect_connected = %v during the outage, want 0", got)
	}
	if err := c.Healthy(); err == nil || !strings.Contains(err.Error(), "third party") {
		t.Errorf("Healthy() = %v during the outage, want the third party named", err)
	}

	tp.SetDown(nil)
	requireBookedOnce(t, f, tp, evs)
	requireBookedInOrder(t, tp, evs)
	testenv.WaitFor(t, 10*time.Second, "Healthy and inbox_effect_connected to recover", func() (bool, error) {
		return c.Healthy() == nil && testenv.MetricValue(t, f.Registry, "inbox_effect_connected") == 1, nil
	})
}
