package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Bug 1: a call that fails with a plain error on its last allowed attempt
// may have landed. Its dead letter, requeued, must be checked before it is
// called again: the requeue must not forget "may have called".
func TestARequeuedLeaseDeadLetterWhoseCallMayHaveLandedIsCheckedFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	party := inboxtesting.NewBookingParty()
	party.Set(errors.New("502 Bad Gateway (the booking landed)"))
	cfg := lease.Config{Config: inboxtesting.FastRetries("requeue-check", dlt), LeaseTTL: 600 * time.Millisecond}
	cfg.MaxAttempts = 1
	c, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, party.Effect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ev := inboxtesting.NewEvent("order-1", 1)
	m := event.ToKafka(f.Topic, ev)
	inboxtesting.Handle(t, c, m)
	if s := f.Status(t, cfg.Name, ev); s != "dead_lettered" || party.Bookings(ev.EventID.String()) != 1 {
		t.Fatalf("after the failed last call: row %s, %d bookings; want dead_lettered and 1", s, party.Bookings(ev.EventID.String()))
	}

	party.Set(nil) // the third party answers again
	f.Requeue(t, dlt, 1, ev.EventID)
	inboxtesting.Handle(t, c, inboxtesting.LastMessage(t, f.Brokers, f.Topic))
	if n := party.Bookings(ev.EventID.String()); n != 1 {
		t.Fatalf("the requeued letter was booked %d times in all (row %s), want once: its redelivery must check first",
			n, f.Status(t, cfg.Name, ev))
	}
	if s := f.Status(t, cfg.Name, ev); s != "processed" {
		t.Fatalf("the requeued letter's row is %s, want processed", s)
	}
}

// Bug 3: two aggregate types share an id (order and payment both use the
// order id). When the payment's v2 dies in lease mode, the payment's
// version guard goes back below v2; it must go back to what the payment
// applied (nothing), not to the order's v1, or the payment's v1, arriving
// late, is skipped as stale and never applied.
func TestADeadLeasedEventMovesBackOnlyItsOwnAggregateTypesGuard(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	party := inboxtesting.NewBookingParty()
	order1, order2 := inboxtesting.NewEvent("order-3", 1), inboxtesting.NewEvent("order-3", 2)
	order1.AggregateType, order2.AggregateType = "order", "order"
	pay1, pay2 := inboxtesting.NewEvent("order-3", 1), inboxtesting.NewEvent("order-3", 2)
	pay1.AggregateType, pay2.AggregateType = "payment", "payment"
	party.Refuse[pay2.EventID.String()] = inbox.Permanent(errors.New("refused"))
	c, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, party.Effect(),
		lease.Config{Config: inboxtesting.FastRetries("two-types", dlt)})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []event.Envelope{order1, order2, pay2, pay1} {
		inboxtesting.Handle(t, c, event.ToKafka(f.Topic, ev))
	}
	if s := f.Status(t, "two-types", pay2); s != "dead_lettered" {
		t.Fatalf("payment v2 is %s, want dead_lettered", s)
	}
	if n := party.Bookings(pay1.EventID.String()); n != 1 {
		t.Fatalf("payment v1 booked %d times (row %s), want once: the payment's guard was moved back to the order's version",
			n, f.Status(t, "two-types", pay1))
	}
}

// Suspected third: when marking a called message done keeps failing (here
// Effect.Done refuses its record), the lease used to be given up with "row
// stays leased" while the offset moved on: the message ended neither
// processed nor dead, and no redelivery would come. The side effect
// happened: the row must end visible, uncertain, for reconciliation.
func TestALeaseThatCannotBeMarkedDoneEndsUncertainNotLeased(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	party := inboxtesting.NewBookingParty()
	eff := party.Effect()
	eff.Done = func(context.Context, pgx.Tx, event.Envelope, lease.Outcome) error {
		return errors.New("the outcomes table refuses the record")
	}
	c, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, eff,
		lease.Config{Config: inboxtesting.FastRetries("done-fails", dlt)})
	if err != nil {
		t.Fatal(err)
	}
	ev := inboxtesting.NewEvent("order-5", 1)
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, ev))
	if s := f.Status(t, "done-fails", ev); s != "uncertain" {
		t.Fatalf("the message whose effect happened but could not be marked done is %s, want uncertain", s)
	}
	if n := party.Bookings(ev.EventID.String()); n != 1 {
		t.Fatalf("booked %d times, want once", n)
	}
}

// A stale dead letter holds nothing, so its requeue is known by its row
// alone (requeued). In lease mode the guard advances when a message is
// leased: another event of the same version that arrives meanwhile is
// stale, and dead-lettered; then the leased one dies, holds its aggregate
// and moves the guard back. The stale one's requeue must be parked behind
// the dead one as a requeue: its row stays requeued, with its attempts and
// reason, not deleted and turned into a parked first delivery; and the
// requeue of the dead one then applies both.
func TestARequeuedDeadLetterOfAStaleEventBehindAnotherDeadEventKeepsItsRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dlt := testenv.NewTopic(t, f.Brokers, 1)
	cfg := inboxtesting.FastRetries("stale-held", dlt)
	cfg.MaxAttempts = 1
	b1, dead := inboxtesting.NewEvent("held", 1), inboxtesting.NewEvent("held", 2)
	late := inboxtesting.NewEvent("held", 2) // another event of version 2: stale while dead is leased
	var (
		mu     sync.Mutex
		broken = true
		booked = map[string]int{}
	)
	calling, fail := make(chan struct{}), make(chan struct{})
	var once sync.Once
	effect := lease.Effect{
		Check: func(_ context.Context, key string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return booked[key] > 0, nil
		},
		Call: func(ctx context.Context, ev event.Envelope, key string) error {
			mu.Lock()
			b := broken
			mu.Unlock()
			if ev.EventID == dead.EventID && b {
				once.Do(func() { close(calling) })
				select {
				case <-fail:
				case <-ctx.Done():
				}
				return inbox.Permanent(errors.New("refused for now"))
			}
			mu.Lock()
			defer mu.Unlock()
			booked[key]++
			return nil
		},
	}
	c, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, effect, lease.Config{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, b1))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Handle(context.Background(), event.ToKafka(f.Topic, dead)); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-calling:
	case <-time.After(30 * time.Second):
		t.Fatal("the dead one's call never started")
	}
	inboxtesting.Handle(t, c, event.ToKafka(f.Topic, late)) // dead holds the guard at 2: late is stale
	close(fail)
	<-done
	for _, ev := range []event.Envelope{late, dead} {
		if s := f.Status(t, "stale-held", ev); s != "dead_lettered" {
			t.Fatalf("%v (version %d) is %s, want dead_lettered", ev.EventID, ev.AggregateVersion, s)
		}
	}
	row := `SELECT status, attempts, coalesce(last_error, '') FROM inbox_messages WHERE consumer = 'stale-held' AND message_id = $1`
	var st, reason string
	var attempts int
	if err := f.Pool.QueryRow(context.Background(), row, late.EventID).Scan(&st, &attempts, &reason); err != nil {
		t.Fatal(err)
	}
	f.Requeue(t, dlt, 1, late.EventID)
	inboxtesting.Handle(t, c, inboxtesting.LastMessage(t, f.Brokers, f.Topic))
	var st2, reason2 string
	var attempts2 int
	if err := f.Pool.QueryRow(context.Background(), row, late.EventID).Scan(&st2, &attempts2, &reason2); err != nil {
		t.Fatalf("the requeued stale dead letter's row is gone (%v): the requeue became a parked first delivery", err)
	}
	if st2 != "requeued" || attempts2 != attempts || reason2 != reason {
		t.Fatalf("the requeued stale dead letter's row is %s/%d/%q, want requeued/%d/%q (parked behind the dead one, kept)",
			st2, attempts2, reason2, attempts, reason)
	}
	if n := f.Count(t, `SELECT count(*) FROM inbox_parked_messages WHERE message_id = $1`, late.EventID); n != 1 {
		t.Fatalf("the requeued stale dead letter is not parked behind the dead one")
	}

	mu.Lock()
	broken = false
	mu.Unlock()
	f.Requeue(t, dlt, 1, dead.EventID)
	inboxtesting.Handle(t, c, inboxtesting.LastMessage(t, f.Brokers, f.Topic))
	testenv.WaitFor(t, 30*time.Second, "the dead one, then the parked stale one, done", func() (bool, error) {
		return f.Status(t, "stale-held", dead) == "processed" && f.Status(t, "stale-held", late) == "processed", nil
	})
}
