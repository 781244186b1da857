package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/inboxtesting"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// renewals counts the lease renewals a pool runs (the only UPDATE that sets
// lease_until alone).
type renewals struct{ n atomic.Int64 }

func (r *renewals) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "UPDATE inbox_messages SET lease_until = now()") {
		r.n.Add(1)
	}
	return ctx
}

func (r *renewals) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// callSeen is what a Check or Call saw when it started: the renewals run so
// far, its ctx's deadline and the lease row's lease_until.
type callSeen struct {
	op         string
	renewals   int64
	deadline   time.Time
	leaseUntil time.Time
}

// watchedEffect records a callSeen for every Check and Call; the first Call
// fails when failFirst is set (a message error, retried).
func watchedEffect(t *testing.T, f *fixture, r *renewals, failFirst bool) (lease.Effect, func() []callSeen) {
	var (
		mu    sync.Mutex
		seen  []callSeen
		calls int
	)
	record := func(ctx context.Context, op, key string) {
		s := callSeen{op: op, renewals: r.n.Load()}
		s.deadline, _ = ctx.Deadline()
		if err := f.Pool.QueryRow(context.Background(),
			`SELECT lease_until FROM inbox_messages WHERE message_id = $1`, key).Scan(&s.leaseUntil); err != nil {
			t.Errorf("%s %s: reading its lease: %v", op, key, err)
		}
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
	}
	eff := lease.Effect{
		Check: func(ctx context.Context, key string) (bool, error) {
			record(ctx, "check", key)
			return false, nil
		},
		Call: func(ctx context.Context, _ event.Envelope, key string) error {
			record(ctx, "call", key)
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if failFirst && first {
				return errors.New("refused once")
			}
			return nil
		},
	}
	return eff, func() []callSeen {
		mu.Lock()
		defer mu.Unlock()
		return append([]callSeen(nil), seen...)
	}
}

// runTracedLeaseConsumer runs a lease consumer on a pool of its own that
// counts renewals.
func runTracedLeaseConsumer(t *testing.T, f *fixture, r *renewals, eff lease.Effect, cfg lease.Config) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(f.Pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = r
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Name = "lease-test"
	c, err := lease.NewConsumer(pool, f.Source(testenv.Name("group")), f.Writer, eff, cfg)
	if err != nil {
		t.Fatal(err)
	}
	inboxtesting.RunUntilCleanup(t, c)
}

// requireCallsEndBeforeTheirLeases fails the test for a Check or Call whose
// ctx could outlive its lease minus margin: the guarantee a renewal gives,
// which a call under a fresh batch lease must keep too.
func requireCallsEndBeforeTheirLeases(t *testing.T, seen []callSeen, margin time.Duration) {
	t.Helper()
	for i, s := range seen {
		if s.deadline.IsZero() || s.deadline.Add(margin).After(s.leaseUntil) {
			t.Errorf("%s #%d: its ctx ends at %v, its lease at %v: less than LeaseMargin (%v) apart",
				s.op, i+1, s.deadline.Format(time.RFC3339Nano), s.leaseUntil.Format(time.RFC3339Nano), margin)
		}
	}
}

// The first call of each message of a batch starts right after the batch's
// lease transaction, which took the lease under the same token: it runs
// under that lease without a renewal (a round trip and a commit each), and
// its ctx still ends LeaseMargin before the lease can.
func TestCallsUnderAFreshBatchLeaseNeedNoRenewal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.leaseEvents(t, 6, 1)
	var r renewals
	eff, seen := watchedEffect(t, f, &r, false)
	// Calls may start up to CallTimeout/10 (2s) after their lease: a margin
	// no scheduler on a loaded machine comes near.
	cfg := lease.Config{LeaseTTL: time.Minute}
	runTracedLeaseConsumer(t, f, &r, eff, cfg)
	testenv.WaitFor(t, 60*time.Second, "every event marked done", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == len(evs), nil
	})
	got := seen()
	if len(got) != len(evs) {
		t.Fatalf("%d calls for %d events: %+v", len(got), len(evs), got)
	}
	if n := r.n.Load(); n != 0 {
		t.Fatalf("%d lease renewals for %d first calls under fresh batch leases, want none", n, len(evs))
	}
	requireCallsEndBeforeTheirLeases(t, got, cfg.WithDefaults().LeaseMargin)
}

// A call that starts long after its lease was taken (here: the retry of a
// failed call, which first waits LeaseMargin and checks) renews first, as
// before; so does the check. Every call's ctx ends LeaseMargin before its
// lease.
func TestALateCallUnderABatchLeaseRenewsFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.leaseEvents(t, 1, 1)
	var r renewals
	eff, seen := watchedEffect(t, f, &r, true)
	cfg := lease.Config{LeaseTTL: 2 * time.Second,
		Config: inbox.Config{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond}}
	runTracedLeaseConsumer(t, f, &r, eff, cfg)
	testenv.WaitFor(t, 60*time.Second, "the event marked done", func() (bool, error) {
		return f.Count(t, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'") == 1, nil
	})
	got := seen()
	ops := make([]string, len(got))
	for i, s := range got {
		ops[i] = s.op
	}
	if strings.Join(ops, ",") != "call,check,call" {
		t.Fatalf("the third party saw %v, want call, check, call", ops)
	}
	if got[0].renewals != 0 || got[1].renewals != 1 || got[2].renewals != 2 {
		t.Fatalf("renewals before each: %d, %d, %d; want 0 (fresh lease), 1, 2 (each after its own renewal)",
			got[0].renewals, got[1].renewals, got[2].renewals)
	}
	requireCallsEndBeforeTheirLeases(t, got, cfg.WithDefaults().LeaseMargin)
}
