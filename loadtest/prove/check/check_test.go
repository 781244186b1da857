package check_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/loadtest/prove/check"
)

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// life is the history of one order that went right: placed, published,
// charged, booked; cancelled ones refunded after, in order, everywhere.
func life(id string, cancelled bool) []check.Record {
	recs := []check.Record{
		{Kind: check.KindPlace, At: t0, Key: "k-" + id, Order: id, Outcome: check.OK},
	}
	status, charge := "placed", "captured"
	if cancelled {
		recs = append(recs, check.Record{Kind: check.KindCancel, At: t0.Add(time.Millisecond), Order: id, Outcome: check.OK})
		status, charge = "cancelled", "refunded"
	}
	recs = append(recs,
		check.Record{Kind: check.KindOrder, Order: id, Status: status},
		check.Record{Kind: check.KindMessage, Service: "orders", Order: id, Event: id + "-e1", Type: "OrderPlaced", Version: 1, Offset: 10},
		check.Record{Kind: check.KindInbox, Service: "billing", Order: id, Event: id + "-e1", Type: "OrderPlaced", Version: 1, Status: "processed"},
		check.Record{Kind: check.KindCharge, Order: id, Status: charge, Version: 1},
		check.Record{Kind: check.KindMessage, Service: "billing", Order: id, Event: id + "-p1", Type: "PaymentCaptured", Version: 1, Offset: 20},
		check.Record{Kind: check.KindBooking, At: t0.Add(time.Second), Seq: 1, Order: id, Type: "capture", Key: id + "-p1"},
	)
	if cancelled {
		recs = append(recs,
			check.Record{Kind: check.KindMessage, Service: "orders", Order: id, Event: id + "-e2", Type: "OrderCancelled", Version: 2, Offset: 11},
			check.Record{Kind: check.KindMessage, Service: "billing", Order: id, Event: id + "-p2", Type: "PaymentRefunded", Version: 2, Offset: 21},
			check.Record{Kind: check.KindBooking, At: t0.Add(2 * time.Second), Seq: 2, Order: id, Type: "refund", Key: id + "-p2"},
		)
	}
	return recs
}

func run(extra ...[]check.Record) []check.Record {
	h := []check.Record{{Kind: check.KindRun, Seed: 7, Mode: "poll", Bound: 60}}
	for _, e := range extra {
		h = append(h, e...)
	}
	return h
}

// without drops the records of kind (and, if typ is set, of that type).
func without(recs []check.Record, kind, typ string) []check.Record {
	var out []check.Record
	for _, r := range recs {
		if r.Kind == kind && (typ == "" || r.Type == typ) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// edit applies f to the records of kind (and type, if set).
func edit(recs []check.Record, kind, typ string, f func(*check.Record)) []check.Record {
	out := append([]check.Record(nil), recs...)
	for i := range out {
		if out[i].Kind == kind && (typ == "" || out[i].Type == typ) {
			f(&out[i])
		}
	}
	return out
}

func TestCheck(t *testing.T) {
	clean := append(life("a", false), life("b", true)...)
	tests := []struct {
		name    string
		history []check.Record
		want    map[string]int // findings by kind; nil: none
		// story is a part of the first finding's story, to show it is there.
		story string
	}{
		{name: "clean history passes", history: run(clean,
			[]check.Record{{Kind: check.KindFault, Fault: "pause", Target: "shim-2", At: t0, Until: t0.Add(15 * time.Second)},
				{Kind: check.KindDrain, Seconds: 12, Bound: 60}})},
		{name: "redeliveries and a republished batch are not duplicates", history: run(clean,
			[]check.Record{
				{Kind: check.KindMessage, Service: "orders", Order: "a", Event: "a-e1", Type: "OrderPlaced", Version: 1, Offset: 30},
				{Kind: check.KindMessage, Service: "billing", Order: "a", Event: "a-p1", Type: "PaymentCaptured", Version: 1, Offset: 31},
			})},
		{name: "refused and absent, unknown and absent pass", history: run(clean, []check.Record{
			{Kind: check.KindPlace, Key: "k-x", Outcome: check.Refused},
			{Kind: check.KindPlace, Key: "k-y", Outcome: check.Unknown},
		})},
		{name: "unknown placement that committed, linked by its key, is checked", history: run(
			edit(without(life("a", false), check.KindBooking, ""), check.KindPlace, "", func(r *check.Record) { r.Order, r.Outcome = "", check.Unknown }),
			[]check.Record{{Kind: check.KindOrder, Order: "a", Key: "k-a", Status: "placed"}}),
			want: map[string]int{check.Loss: 1}, story: "client: place (key k-a) → unknown"},
		{name: "acknowledged order missing", history: run(without(life("a", false), check.KindOrder, "")[:1]),
			want: map[string]int{check.Atomicity: 1}},
		{name: "refused order present", history: run(edit(life("a", false), check.KindPlace, "", func(r *check.Record) { r.Outcome = check.Refused })),
			want: map[string]int{check.Atomicity: 1}},
		{name: "acknowledged cancellation not done", history: run(edit(life("b", true), check.KindOrder, "", func(r *check.Record) { r.Status = "placed" })),
			// the stand-in then also refunded an order that is not cancelled: only the atomicity finding counts here
			want: map[string]int{check.Atomicity: 1}},
		{name: "event never published, nothing dead: loss", history: run(
			without(without(without(without(life("a", false), check.KindMessage, ""), check.KindCharge, ""), check.KindBooking, ""), check.KindInbox, "")),
			want: map[string]int{check.Loss: 1}, story: "client: place (key k-a) → ok"},
		{name: "capture never booked: loss", history: run(without(life("a", false), check.KindBooking, "")),
			want: map[string]int{check.Loss: 1}, story: "billing db: charge captured"},
		{name: "capture dead-lettered and never requeued: unresolved", history: run(without(life("a", false), check.KindBooking, ""),
			[]check.Record{{Kind: check.KindInbox, Service: "shim", Order: "a", Event: "a-p1", Type: "PaymentCaptured", Version: 1, Status: "dead_lettered"}}),
			want: map[string]int{check.Unresolved: 1}, story: "shim inbox: PaymentCaptured v1 dead_lettered"},
		{name: "an order's OrderPlaced parked behind its dead OrderCancelled: unresolved", history: run(
			without(without(without(without(life("b", true), check.KindCharge, ""), check.KindBooking, ""), check.KindMessage, "PaymentCaptured"), check.KindMessage, "PaymentRefunded"),
			[]check.Record{
				{Kind: check.KindInbox, Service: "billing", Order: "b", Event: "b-e1", Type: "OrderPlaced", Version: 1, Status: "parked"},
				{Kind: check.KindInbox, Service: "billing", Order: "b", Event: "b-e2", Type: "OrderCancelled", Version: 2, Status: "dead_lettered"},
			}),
			want: map[string]int{check.Unresolved: 1}, story: "billing inbox: OrderPlaced v1 parked"},
		{name: "an uncertain forward left: unresolved", history: run(without(life("a", false), check.KindBooking, ""),
			[]check.Record{{Kind: check.KindInbox, Service: "shim", Order: "a", Type: "PaymentCaptured", Version: 1, Status: "uncertain"}}),
			want: map[string]int{check.Unresolved: 1}},
		{name: "booked twice: duplicate", history: run(life("a", false),
			[]check.Record{{Kind: check.KindBooking, At: t0.Add(3 * time.Second), Seq: 9, Order: "a", Type: "capture", Key: "a-p1"}}),
			want: map[string]int{check.Duplicate: 1}, story: "third party: booking #9 capture"},
		{name: "two payments booked for one order: duplicate", history: run(life("a", false),
			[]check.Record{{Kind: check.KindBooking, At: t0.Add(3 * time.Second), Seq: 9, Order: "a", Type: "capture", Key: "a-p9"}}),
			want: map[string]int{check.Duplicate: 1}},
		{name: "charged twice under two event ids: duplicate", history: run(life("a", false),
			[]check.Record{{Kind: check.KindMessage, Service: "billing", Order: "a", Event: "a-p9", Type: "PaymentCaptured", Version: 3, Offset: 40}}),
			want: map[string]int{check.Duplicate: 1}},
		{name: "refund booked and capture never: order (and the capture's loss)", history: run(without(life("b", true), check.KindBooking, "capture")),
			want: map[string]int{check.Order: 1, check.Loss: 1}, story: "booking #2 refund"},
		{name: "refund booked before capture: order", history: run(edit(life("b", true), check.KindBooking, "", func(r *check.Record) { r.Seq = 10 - r.Seq })),
			want: map[string]int{check.Order: 1}, story: "third party: booking #8 refund"},
		{name: "relay published v2 before v1: order", history: run(edit(life("b", true), check.KindMessage, "OrderCancelled", func(r *check.Record) { r.Offset = 5 })),
			want: map[string]int{check.Order: 1}},
		{name: "billing dead-lettered OrderCancelled before it captured, OrderPlaced first on the topic: order", history: run(
			edit(life("b", true), check.KindMessage, "PaymentCaptured", func(r *check.Record) { r.At = t0.Add(2 * time.Second) }),
			[]check.Record{{Kind: check.KindDeadLetter, At: t0.Add(time.Second), Service: "orders", Order: "b", Event: "b-e2",
				Type: "OrderCancelled", Version: 2, Detail: "permanent failure: no charge to refund"}}),
			want: map[string]int{check.Order: 1}, story: "no charge to refund"},
		{name: "an OrderCancelled dead-lettered after the capture is not an order finding", history: run(
			edit(life("b", true), check.KindMessage, "PaymentCaptured", func(r *check.Record) { r.At = t0.Add(time.Second) }),
			[]check.Record{{Kind: check.KindDeadLetter, At: t0.Add(2 * time.Second), Service: "orders", Order: "b", Event: "b-e2",
				Type: "OrderCancelled", Version: 2, Detail: "requeued later"}})},
		{name: "billing refunded before it captured: order", history: run(edit(life("b", true), check.KindMessage, "PaymentRefunded", func(r *check.Record) { r.Offset = 1 })),
			want: map[string]int{check.Order: 1}},
		{name: "cancelled order whose charge stands: order", history: run(edit(without(without(life("b", true), check.KindBooking, "refund"), check.KindMessage, "PaymentRefunded"),
			check.KindCharge, "", func(r *check.Record) { r.Status = "captured" })),
			want: map[string]int{check.Order: 1}},
		{name: "never drained: liveness", history: run(clean, []check.Record{{Kind: check.KindDrain, Seconds: -1, Bound: 60, Detail: "lag 12"}}),
			want: map[string]int{check.Liveness: 1}},
		{name: "drained too slowly: liveness", history: run(clean, []check.Record{{Kind: check.KindDrain, Seconds: 90, Bound: 60}}),
			want: map[string]int{check.Liveness: 1}},
		{name: "a clean end-of-run reconciliation passes", history: run(clean, []check.Record{{Kind: check.KindReconcile, Outcome: check.Clean}})},
		{name: "the end-of-run reconciliation reports something: unresolved", history: run(clean,
			[]check.Record{{Kind: check.KindReconcile, Outcome: check.Findings, Detail: "order_without_charge in billing: 1 (c)"}}),
			want: map[string]int{check.Unresolved: 1}, story: "still reports: order_without_charge in billing: 1 (c)"},
		{name: "a fault near the order is in its story", history: run(without(life("a", false), check.KindBooking, ""),
			[]check.Record{{Kind: check.KindFault, Fault: "pause", Target: "shim-2", At: t0.Add(-5 * time.Second), Until: t0.Add(10 * time.Second)}}),
			want: map[string]int{check.Loss: 1}, story: "nemesis: pause shim-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := check.Check(tt.history)
			got := res.ByKind()
			if len(got) != len(tt.want) {
				t.Errorf("findings by kind = %v, want %v; findings: %+v", got, tt.want, res.Findings)
			}
			for k, n := range tt.want {
				if got[k] != n {
					t.Errorf("%s findings = %d, want %d; findings: %+v", k, got[k], n, res.Findings)
				}
			}
			if tt.story != "" {
				var b bytes.Buffer
				check.Stories(&b, res, 0)
				if !strings.Contains(b.String(), tt.story) {
					t.Errorf("the stories do not tell %q:\n%s", tt.story, b.String())
				}
			}
			if res.Seed != 7 || res.Mode != "poll" {
				t.Errorf("seed %d mode %q, want the run record's 7 and poll", res.Seed, res.Mode)
			}
		})
	}
}

// TestHistoryRoundTrip: what the nemesis writes the checker reads back
// unchanged, so a saved run re-checks to the same result.
func TestHistoryRoundTrip(t *testing.T) {
	h := run(life("a", false), life("b", true), []check.Record{{Kind: check.KindFault, Fault: "kill", Target: "billing", At: t0}})
	var buf bytes.Buffer
	w := check.NewWriter(&buf)
	for _, r := range h {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	back, err := check.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != len(h) {
		t.Fatalf("read %d records, wrote %d", len(back), len(h))
	}
	for i := range h {
		if !back[i].At.Equal(h[i].At) || back[i].Kind != h[i].Kind || back[i].Order != h[i].Order || back[i].Offset != h[i].Offset {
			t.Fatalf("record %d: read %+v, wrote %+v", i, back[i], h[i])
		}
	}
	res := check.Check(back)
	if !res.OK() || res.Orders != 2 || res.Faults["kill"] != 1 {
		t.Fatalf("re-checked: ok %v, orders %d, faults %v; want ok, 2, kill 1", res.OK(), res.Orders, res.Faults)
	}
	var table bytes.Buffer
	check.Table(&table, []check.Result{res})
	if !strings.Contains(table.String(), "kill 1") || !strings.Contains(table.String(), "PASS") {
		t.Fatalf("table:\n%s", table.String())
	}
}
