package outboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Backlog counts the rows of each state old enough, reports the oldest and
// samples the oldest first; published rows and young ones are not counted.
func TestBacklogCountsOldPendingAndDeadRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := outboxtest.NewDatabase(t)

	_, oldPending := outboxtest.Seed(t, pool, outboxtest.Row{State: "pending", Age: 2 * time.Hour})
	_, midPending := outboxtest.Seed(t, pool, outboxtest.Row{State: "pending", Age: time.Hour})
	outboxtest.Seed(t, pool, outboxtest.Row{State: "pending", Age: time.Minute})
	outboxtest.Seed(t, pool, outboxtest.Row{State: "published", Age: 3 * time.Hour})
	_, oldDead := outboxtest.Seed(t, pool, outboxtest.Row{State: "dead", Age: time.Hour, LastError: "too large"})
	outboxtest.Seed(t, pool, outboxtest.Row{State: "dead", Age: time.Second})

	before := time.Now()
	rep, err := outboxadmin.Backlog(ctx, pool, outboxadmin.BacklogConfig{PendingOlderThan: 30 * time.Minute, Samples: 5})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pending.Count != 2 || !slices.Equal(rep.Pending.Samples, []uuid.UUID{oldPending, midPending}) {
		t.Errorf("pending: %+v, want 2: %v, %v", rep.Pending, oldPending, midPending)
	}
	if age := before.Sub(rep.Pending.Oldest); age < 2*time.Hour-time.Minute || age > 2*time.Hour+time.Minute {
		t.Errorf("the oldest pending row is %v old, want about 2h", age)
	}
	if rep.Dead.Count != 2 || len(rep.Dead.Samples) != 2 || rep.Dead.Samples[0] != oldDead {
		t.Errorf("dead: %+v, want 2, %v first", rep.Dead, oldDead)
	}

	// Fewer samples than rows: the oldest; none asked, none read.
	rep, err = outboxadmin.Backlog(ctx, pool, outboxadmin.BacklogConfig{DeadOlderThan: 30 * time.Minute, Samples: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pending.Count != 3 || !slices.Equal(rep.Pending.Samples, []uuid.UUID{oldPending}) || rep.Dead.Count != 1 {
		t.Errorf("%+v, want 3 pending (sample %v), 1 dead", rep, oldPending)
	}
	rep, err = outboxadmin.Backlog(ctx, pool, outboxadmin.BacklogConfig{PendingOlderThan: 24 * time.Hour, DeadOlderThan: 24 * time.Hour})
	if err != nil || rep.Pending.Count != 0 || !rep.Pending.Oldest.IsZero() || rep.Dead.Count != 0 || rep.Dead.Samples != nil {
		t.Errorf("nothing a day old: %+v, %v", rep, err)
	}
}

// A negative age is refused before any read; a database without the outbox
// schema is an error carrying SQLSTATE 42P01, never an empty backlog; an
// unreachable one is ErrUnavailable.
func TestBacklogErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, cfg := range []outboxadmin.BacklogConfig{{PendingOlderThan: -time.Second}, {DeadOlderThan: -1}, {Samples: -1}} {
		if _, err := outboxadmin.Backlog(ctx, nil, cfg); err == nil {
			t.Errorf("%+v: accepted", cfg)
		}
	}

	_, err := outboxadmin.Backlog(ctx, testenv.NewPool(t, testenv.NewDatabase(t)), outboxadmin.BacklogConfig{})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Errorf("an empty database: %v, want SQLSTATE 42P01", err)
	}

	closed := outboxtest.NewDatabase(t)
	closed.Close()
	if _, err := outboxadmin.Backlog(ctx, closed, outboxadmin.BacklogConfig{}); !errors.Is(err, outbox.ErrUnavailable) {
		t.Errorf("a closed pool: %v, want ErrUnavailable", err)
	}
}

// An operator's check (tools/reconcile does this) asks for pending rows the
// relay should have published by now and for dead rows, which each need a
// decision; it reads only, so a read-only role can run it.
func ExampleBacklog() {
	ctx := context.Background()
	pool, _, _, cleanup := exampleSetup(ctx)
	defer cleanup()
	if err := enqueueOrders(ctx, pool, "order-1", "order-2", "order-3"); err != nil {
		fmt.Println(err)
		return
	}
	// Stand in for the relay, which gave up on one of them.
	if _, err := pool.Exec(ctx, `UPDATE outbox_events SET state = 'dead', last_error = 'unknown topic' WHERE aggregate_id = 'order-1'`); err != nil {
		fmt.Println(err)
		return
	}

	rep, err := outboxadmin.Backlog(ctx, pool, outboxadmin.BacklogConfig{PendingOlderThan: 5 * time.Minute, Samples: 3})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pending for over 5 minutes:", rep.Pending.Count)
	fmt.Println("dead:", rep.Dead.Count, "sampled:", len(rep.Dead.Samples))
	// Output:
	// pending for over 5 minutes: 0
	// dead: 1 sampled: 1
}
