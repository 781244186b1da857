package lease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Issue 32: with asynchronous replication a failover loses the primary's
// last commits, and with them the lease-mode row that recorded a call (its
// lease, or its done mark). The message is redelivered (its offset was
// never committed: offsets commit after the database) and finds no row: a
// first delivery, by every sign the inbox had, so it called again without a
// check, and a third party that cannot dedupe booked twice.
//
// The failover is simulated the way it looks from the database the
// consumer reaches afterwards: the row is gone, and the server the consumer
// recorded (inbox_servers, replicated long before) is not the one it now
// talks to. A real standby promoted under the consumer gives the same two
// facts (docs/inbox.md, "After a failover").
func TestAfterAServerSwitchALostLeaseRowIsCheckedBeforeItsFirstCall(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			party := inboxtesting.NewBookingParty()
			var checks atomic.Int64
			eff := party.Effect()
			check := eff.Check
			eff.Check = func(ctx context.Context, key string) (bool, error) {
				checks.Add(1)
				return check(ctx, key)
			}
			var mu sync.Mutex
			present := 0
			eff.Done = func(_ context.Context, _ pgx.Tx, _ event.Envelope, o lease.Outcome) error {
				mu.Lock()
				defer mu.Unlock()
				if o == lease.AlreadyPresent {
					present++
				}
				return nil
			}
			cfg := lease.Config{Config: inboxtesting.FastRetries("switch-check", testenv.NewTopic(t, f.Brokers, 1))}
			c, err := lease.NewConsumer(f.Pool, f.Source(testenv.Name("group")), f.Writer, eff, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ev := inboxtesting.NewEvent("order-1", 1)
			m := event.ToKafka(f.Topic, ev)
			m.Time = time.Now()
			other := inboxtesting.NewEvent("order-2", 1) // in the same batch, with a row that survived
			om := event.ToKafka(f.Topic, other)
			om.Time = time.Now()
			if batch {
				inboxtesting.Handle(t, c, m, om)
			} else {
				inboxtesting.Handle(t, c, m)
				inboxtesting.Handle(t, c, om)
			}
			if n := party.Bookings(ev.EventID.String()); n != 1 || checks.Load() != 0 {
				t.Fatalf("first delivery: %d bookings, %d checks; want 1 and 0", n, checks.Load())
			}

			// The failover: the transaction that leased ev (its row and its
			// aggregate's version guard) did not reach the standby, and the
			// consumer now talks to another server.
			ctx := context.Background()
			if _, err := f.Pool.Exec(ctx, `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, cfg.Name, ev.EventID); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Pool.Exec(ctx, `DELETE FROM inbox_aggregate_versions WHERE consumer = $1 AND aggregate_id = $2`,
				cfg.Name, ev.AggregateID); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Pool.Exec(ctx, `UPDATE inbox_servers SET server = 'the old primary' WHERE consumer = $1`, cfg.Name); err != nil {
				t.Fatal(err)
			}

			// A message produced after the switch (past the clock margin)
			// cannot have been called before it: no check.
			later := inboxtesting.NewEvent("order-3", 1)
			lm := event.ToKafka(f.Topic, later)
			lm.Time = time.Now().Add(5 * time.Minute)
			if batch {
				inboxtesting.Handle(t, c, m, om, lm)
			} else {
				inboxtesting.Handle(t, c, m)
				inboxtesting.Handle(t, c, om)
				inboxtesting.Handle(t, c, lm)
			}
			if n := party.Bookings(ev.EventID.String()); n != 1 {
				t.Fatalf("the redelivery of a call whose row the failover lost booked it %d times in all (%d checks), want once: "+
					"after a server switch a first delivery from before it must check first", n, checks.Load())
			}
			if got := checks.Load(); got != 1 {
				t.Fatalf("%d checks, want 1: only the message from before the switch whose row is missing", got)
			}
			if party.Bookings(later.EventID.String()) != 1 || party.Bookings(other.EventID.String()) != 1 {
				t.Fatalf("bookings: later %d, other %d; want 1 each", party.Bookings(later.EventID.String()), party.Bookings(other.EventID.String()))
			}
			if s := f.Status(t, cfg.Name, ev); s != "processed" {
				t.Fatalf("the redelivered row is %s, want processed", s)
			}
			mu.Lock()
			if present != 1 {
				t.Errorf("%d outcomes %s, want 1: the redelivery found its key at the other side", present, lease.AlreadyPresent)
			}
			mu.Unlock()
			var server string
			var switched bool
			if err := f.Pool.QueryRow(ctx, `SELECT server, switched_at IS NOT NULL FROM inbox_servers WHERE consumer = $1`, cfg.Name).
				Scan(&server, &switched); err != nil {
				t.Fatal(err)
			}
			if server == "the old primary" || !switched {
				t.Fatalf("inbox_servers: server %q, switched %v; want the current server and the switch recorded", server, switched)
			}
		})
	}
}
