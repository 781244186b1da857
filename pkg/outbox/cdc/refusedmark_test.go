package cdc_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// A dead mark refused because the row was requeued between the lane's
// decision and its mark (another instance's mark and an operator's requeue
// got there first) still holds the aggregate, and must: an event of the
// aggregate committed before the requeue comes ahead of the requeued copy
// in the stream, and publishing it would put big/2 before big/1. The copy
// lifts the hold when it arrives (the aggregate's next dead row, big/2,
// holds from then on, as for any chain of held rows), and requeueing the
// dead rows publishes the rest in order. The row lock the test holds on big/1 makes the schedule
// deterministic: the relay's mark waits on it while the test commits
// big/2, then the mark and the requeue.
func TestCDCRefusedDeadMarkOfARequeuedRowHoldsUntilTheCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cfg := newHoldbackCDCEnv(t, 1)
	wide := newWideWriter(e.Brokers)
	t.Cleanup(func() { wide.Close() })

	// The slot first: creating it waits for the test's transaction.
	runStreaming(t, newCDC(t, e.Pool, wide, cfg))()

	big1, big2, big3 := newEvent("big", 1), newEvent("big", 2), newEvent("big", 3)
	big1.Payload = blob("x", bigBlob)
	enqueue(t, e.Pool, big1)
	op, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Rollback(ctx)
	var id1 int64
	if err := op.QueryRow(ctx, `SELECT id FROM outbox_events WHERE event_id = $1 FOR UPDATE`, big1.EventID).Scan(&id1); err != nil {
		t.Fatal(err)
	}

	runCDC(t, newCDC(t, e.Pool, wide, cfg))
	testenv.WaitFor(t, 30*time.Second, "the relay's dead mark of big/1 waiting on the row lock", func() (bool, error) {
		var n int
		err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE 'UPDATE outbox_events SET state = ''dead''%'`).Scan(&n)
		return n == 1, err
	})
	enqueue(t, e.Pool, big2)
	raiseTopicMax(t, e.Brokers, e.Topic)
	if _, err := op.Exec(ctx, `UPDATE outbox_events SET state = 'dead', last_error = 'the other instance' WHERE id = $1`, id1); err != nil {
		t.Fatal(err)
	}
	if n, err := outboxadmin.Requeue(ctx, op, outbox.ModeCDC, id1); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}
	if err := op.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	enqueue(t, e.Pool, big3)

	bigs := func() []string {
		return slices.DeleteFunc(onTopic(t, e.Brokers, e.Topic), func(s string) bool { return !strings.HasPrefix(s, "big/") })
	}
	dead := func(ev string) string { return "state = 'dead' AND event_id = '" + ev + "'" }
	testenv.WaitFor(t, 30*time.Second, "big/1's copy published and big/3 settled", func() (bool, error) {
		return slices.Contains(bigs(), "big/1") && countRows(t, e.Pool, dead(big3.EventID.String())) == 1 ||
			slices.Contains(bigs(), "big/3"), nil
	})
	if got := bigs(); !slices.Equal(got, []string{"big/1"}) {
		t.Fatalf("the topic holds big's events %v, want [big/1]: its copy, with big/2 (committed before the requeue) "+
			"held back behind it, and big/3 behind big/2", got)
	}
	if n := countRows(t, e.Pool, dead(big2.EventID.String())); n != 1 {
		t.Fatalf("big/2's row: %d dead, want 1 (held back behind big/1)", n)
	}
	// The operator requeues what is dead: the aggregate goes on, in order.
	if n, err := outboxadmin.RequeueDead(ctx, e.Pool, outbox.ModeCDC, outboxadmin.DeadFilter{}); err != nil || n != 2 {
		t.Fatalf("RequeueDead = %d, %v; want 2", n, err)
	}
	testenv.WaitFor(t, 30*time.Second, "big/2 and big/3 published", func() (bool, error) {
		return len(bigs()) >= 3, nil
	})
	if got := bigs(); !slices.Equal(got, []string{"big/1", "big/2", "big/3"}) {
		t.Fatalf("the topic holds big's events %v, want [big/1 big/2 big/3]", got)
	}
}
