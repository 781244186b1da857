package inbox_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/platform/testinfra"
)

// secondMember runs a second member of the lease-mode consumer (the same
// consumer Name, so the same inbox rows and leases) with the same messages
// in hand as the first: what a rebalance leaves behind while the old holder
// is still working on what it fetched (slow, frozen, or in its drain
// window) and the new owner of the partition fetches the same messages.
// It reads the topic in a group of its own, so that it has them at once
// whatever the group's assignment says: the two members then meet only
// where the bugs live, at the leases.
func (f *fixture) secondMember(t *testing.T, eff inbox.Effect, cfg inbox.Config) {
	t.Helper()
	runUntilCleanup(t, f.leaseConsumer(t, testinfra.Name("second"), eff, cfg))
}

// requireBookedOnce waits until the third party has nothing in flight and
// every event is marked done, then fails the test for each event it booked
// other than once.
func requireBookedOnce(t *testing.T, f *fixture, tp *inboxtest.ThirdParty, evs []event.Envelope) {
	t.Helper()
	testinfra.WaitFor(t, 60*time.Second, "every event marked done, and no call left in flight", func() (bool, error) {
		return f.count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == len(evs) && tp.InFlight() == 0, nil
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
	tp := inboxtest.NewThirdParty()
	tp.SetDelay(700 * time.Millisecond)
	// Calls of 700ms fit in the call timeout; the lease outlasts call and
	// margin.
	cfg := inbox.Config{Workers: 1, MaxInFlight: 1, LeaseTTL: time.Second,
		CallTimeout: 750 * time.Millisecond, LeaseMargin: 200 * time.Millisecond,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}

	runUntilCleanup(t, f.leaseConsumer(t, testinfra.Name("group"), tp.Effect(), cfg))
	testinfra.WaitFor(t, 30*time.Second, "the first member's first call", func() (bool, error) {
		return tp.Received() >= 1, nil
	})
	f.secondMember(t, tp.Effect(), cfg)
	requireBookedOnce(t, f, tp, evs)
}

// A member frozen while it holds a lease (here: right before its call
// reaches the third party) outlives its lease; the second member takes the
// message over and books it. When the first one wakes up, its call must not
// book the message again.
func TestLeaseHolderFrozenPastItsLeaseDoesNotCallAfterTheTakeover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 1, 1)
	tp := inboxtest.NewThirdParty()
	cfg := inbox.Config{Workers: 1, LeaseTTL: time.Second,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}

	frozen := inboxtest.NewPausable(tp.Effect())
	frozen.Pause()
	runUntilCleanup(t, f.leaseConsumer(t, testinfra.Name("group"), frozen.Effect(), cfg))
	testinfra.WaitFor(t, 30*time.Second, "the first member to freeze on its call", func() (bool, error) {
		return frozen.Waiting() == 1, nil
	})
	f.secondMember(t, tp.Effect(), cfg)
	testinfra.WaitFor(t, 30*time.Second, "the second member to take the message over and book it", func() (bool, error) {
		return f.count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == 1, nil
	})
	frozen.Resume()
	testinfra.WaitFor(t, 30*time.Second, "the first member's call to return", func() (bool, error) {
		return frozen.Released() >= 1, nil
	})
	requireBookedOnce(t, f, tp, evs)
}
