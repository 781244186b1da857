package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// TestCDCRetentionIgnoresOtherDatabasesTransactions: what the log-based
// relay published is judged from this database's transactions only. A
// transaction holding an xid in another database of the same Postgres
// (another service's, or another test's under a parallel make test) cannot
// insert into this outbox, yet a horizon taken as a snapshot's xmin, which
// is cluster-wide, waited for it: retention kept published rows and
// Backlog counted them pending for as long as it stayed open (the cause of
// TestCDCMessageErrorSkipsTheEventAsDead's "waiting for retention to keep
// only the dead rows", 28 Nov 2026).
func TestCDCRetentionIgnoresOtherDatabasesTransactions(t *testing.T) {
	t.Parallel()
	e := newCDCEnv(t, 1, 10)
	cfg := e.config()
	cfg.RetentionInterval, cfg.Retain = 50*time.Millisecond, time.Nanosecond
	runStreaming(t, newCDC(t, e.Pool, e.W, cfg))

	// Opened once the slot is consistent: creating a logical slot waits
	// for every transaction of the cluster, which Postgres decides, not the
	// relay.
	other := testenv.NewPool(t, testenv.NewDatabase(t))
	ctx := context.Background()
	hold, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // an xid, as any write takes
		t.Fatal(err)
	}

	enqueue(t, e.Pool, newEvent("a", 1))
	testenv.WaitFor(t, 20*time.Second, "the event on the topic", func() (bool, error) { return e.C.Distinct() == 1, nil })
	defer e.logRetentionState(t)
	testenv.WaitFor(t, 10*time.Second, "retention to delete the published row while another database holds an xid",
		func() (bool, error) { return countRows(t, e.Pool, "true") == 0, nil })
	rep, err := outboxadmin.Backlog(ctx, e.Pool, outboxadmin.BacklogConfig{PendingOlderThan: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pending.Count != 0 {
		t.Errorf("Backlog counts %d pending, want 0", rep.Pending.Count)
	}
}
