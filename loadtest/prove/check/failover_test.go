package check_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/loadtest/prove/check"
)

// Issue 32: what a Postgres failover may take back. An order acknowledged
// at t0 whose every record is gone from the databases and the topics (the
// client's placement is all that is left), under a failover whose window
// holds t0 or not, with synchronous or asynchronous replication.
func TestFailoverRules(t *testing.T) {
	// Placed and acknowledged, then gone with the old primary.
	vanished := []check.Record{{Kind: check.KindPlace, At: t0, Key: "k-v", Order: "v", Outcome: check.OK}}
	// Gone from the orders database, but its OrderPlaced was published
	// and billing charged it: a commit the standby never had, published.
	published := without(life("p", false), check.KindOrder, "")
	// Its capture booked twice under two keys: a redo with a fresh id.
	twice := append(life("d", false),
		check.Record{Kind: check.KindBooking, At: t0.Add(3 * time.Second), Seq: 9, Order: "d", Type: "capture", Key: "d-p1-again"})
	failover := func(mode string, at time.Time) check.Record {
		return check.Record{Kind: check.KindFault, Fault: check.FaultPGFailover, Mode: mode, At: at,
			Seconds: 3, Until: at.Add(20 * time.Second)}
	}
	type test struct {
		name      string
		history   []check.Record
		want      map[string]int
		takenBack int
	}
	tests := []test{
		{"sync: an acknowledged order must survive", run([]check.Record{failover("sync", t0.Add(-time.Second))}, vanished),
			map[string]int{check.Atomicity: 1}, 0},
		{"async: an acknowledged order in the window may be taken back", run([]check.Record{failover("async", t0.Add(-time.Second))}, vanished),
			nil, 1},
		{"async: an acknowledged order long before the window must survive", run([]check.Record{failover("async", t0.Add(time.Minute))}, vanished),
			map[string]int{check.Atomicity: 1}, 0},
		{"async: what was published must not be taken back", run([]check.Record{failover("async", t0.Add(-time.Second))}, published),
			map[string]int{check.Atomicity: 1}, 0},
		{"async: a redone charge is never a second payment", run([]check.Record{failover("async", t0.Add(-time.Second))}, twice),
			map[string]int{check.Duplicate: 1}, 0},
	}
	// Billing's charge of a taken-back order lost with its commit: the
	// end-of-run reconciliation names it, and that is the platform saying
	// so, not a finding; a reconciliation naming another order is one.
	charged := without(life("c", false), check.KindCharge, "")
	charged = without(charged, check.KindBooking, "")
	charged = without(without(charged, check.KindMessage, "PaymentCaptured"), check.KindInbox, "")
	reconcile := func(ids string) check.Record {
		return check.Record{Kind: check.KindReconcile, Outcome: check.Findings, Detail: "order_without_charge in billing: 1 (" + ids + ")"}
	}
	walRun := func(extra ...[]check.Record) []check.Record {
		h := run(extra...)
		h[0].Mode = "wal"
		return h
	}
	tests = append(tests,
		test{"async replicated: a surviving order's lost charge is a finding", run([]check.Record{failover("async replicated", t0.Add(-time.Second)), reconcile("c")}, charged),
			map[string]int{check.Loss: 1, check.Unresolved: 1}, 0},
		test{"async replicated, no failover slots, poll: the same", run([]check.Record{failover("async replicated noslotsync", t0.Add(-time.Second)), reconcile("c")}, charged),
			map[string]int{check.Loss: 1, check.Unresolved: 1}, 0},
		test{"async replicated, no failover slots, WAL-only: the lost slot's documented loss", walRun([]check.Record{failover("async replicated noslotsync", t0.Add(-time.Second)), reconcile("c")}, charged),
			nil, 1},
		test{"async replicated: an acknowledged order in the window may still be taken back", run([]check.Record{failover("async replicated", t0.Add(-time.Second))}, vanished),
			nil, 1},
		test{"async: reconciliation of a taken-back charge", run([]check.Record{failover("async", t0.Add(-time.Second)), reconcile("c")}, charged), nil, 1},
		test{"async: reconciliation of another order", run([]check.Record{failover("async", t0.Add(-time.Second)), reconcile("x")}, charged),
			map[string]int{check.Unresolved: 1}, 1},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := check.Check(tt.history)
			got := res.ByKind()
			if len(got) != len(tt.want) {
				t.Fatalf("findings %v, want %v: %+v", got, tt.want, res.Findings)
			}
			for k, n := range tt.want {
				if got[k] != n {
					t.Fatalf("findings %v, want %v: %+v", got, tt.want, res.Findings)
				}
			}
			if res.TakenBack != tt.takenBack {
				t.Fatalf("taken back %d, want %d", res.TakenBack, tt.takenBack)
			}
		})
	}
}
