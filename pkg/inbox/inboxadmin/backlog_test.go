package inboxadmin_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/pgerr"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Backlog counts each status's rows old enough (an expired lease by its
// lease_until, the others by received_at), oldest first, per consumer or
// all; processed rows, running leases and young rows are not counted.
func TestBacklogCountsLeasesUncertainAndDeadLetters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.NewPool(t, testenv.NewMigratedDatabase(t, testenv.Migration{FS: inbox.Migrations, Table: inbox.MigrationsTable}))

	oldLease := inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "a", Status: "leased", Age: time.Hour, LeaseExpiredAgo: 10 * time.Minute})
	inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "a", Status: "leased", Age: time.Hour, LeaseExpiredAgo: time.Second})
	inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "a", Status: "leased", Age: time.Hour, LeaseExpiredAgo: -time.Minute})
	uncertainA := inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "a", Status: "uncertain", Age: 2 * time.Hour})
	uncertainB := inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "b", Status: "uncertain", Age: time.Minute})
	oldDLQ := inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "b", Status: "dead_lettered", Age: 48 * time.Hour, LastError: "bad payload"})
	inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "b", Status: "dead_lettered", Age: time.Hour})
	inboxtest.Seed(t, pool, inboxtest.Row{Consumer: "a", Status: "processed", Age: 72 * time.Hour})

	before := time.Now()
	rep, err := inboxadmin.Backlog(ctx, pool, inboxadmin.BacklogConfig{LeaseExpiredFor: time.Minute, DeadLetteredOlderThan: 24 * time.Hour, Samples: 5})
	if err != nil {
		t.Fatal(err)
	}
	if rep.LeaseExpired.Count != 1 || !slices.Equal(rep.LeaseExpired.Samples, []uuid.UUID{oldLease}) {
		t.Errorf("expired leases: %+v, want %v", rep.LeaseExpired, oldLease)
	}
	if age := before.Sub(rep.LeaseExpired.Oldest); age < 9*time.Minute || age > 11*time.Minute {
		t.Errorf("the lease expired %v ago, want about 10m", age)
	}
	if rep.Uncertain.Count != 2 || !slices.Equal(rep.Uncertain.Samples, []uuid.UUID{uncertainA, uncertainB}) {
		t.Errorf("uncertain: %+v, want %v, %v", rep.Uncertain, uncertainA, uncertainB)
	}
	if rep.DeadLettered.Count != 1 || !slices.Equal(rep.DeadLettered.Samples, []uuid.UUID{oldDLQ}) {
		t.Errorf("dead letters: %+v, want %v", rep.DeadLettered, oldDLQ)
	}

	// One consumer only, and no samples asked: none read.
	rep, err = inboxadmin.Backlog(ctx, pool, inboxadmin.BacklogConfig{Consumer: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.LeaseExpired.Count != 0 || rep.Uncertain.Count != 1 || rep.DeadLettered.Count != 2 || rep.DeadLettered.Samples != nil {
		t.Errorf("consumer b: %+v, want 0 expired leases, 1 uncertain, 2 dead letters, no samples", rep)
	}
}

// A negative age is refused before any read; a database without the inbox
// schema is an error carrying SQLSTATE 42P01, never an empty backlog; an
// unreachable one is an outage (pgerr.IsUnavailable).
func TestBacklogErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, cfg := range []inboxadmin.BacklogConfig{{LeaseExpiredFor: -1}, {UncertainOlderThan: -1}, {DeadLetteredOlderThan: -1}, {Samples: -1}} {
		if _, err := inboxadmin.Backlog(ctx, nil, cfg); err == nil {
			t.Errorf("%+v: accepted", cfg)
		}
	}

	_, err := inboxadmin.Backlog(ctx, testenv.NewPool(t, testenv.NewDatabase(t)), inboxadmin.BacklogConfig{})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Errorf("an empty database: %v, want SQLSTATE 42P01", err)
	}

	closed := testenv.NewPool(t, testenv.NewDatabase(t))
	closed.Close()
	if _, err := inboxadmin.Backlog(ctx, closed, inboxadmin.BacklogConfig{}); !pgerr.IsUnavailable(err) {
		t.Errorf("a closed pool: %v, want an outage", err)
	}
}
