package prove

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
)

// The crash points, as the services name them (CRASH_POINT).
const (
	crashAfterWrite  = "orders.after-write"
	crashAfterAck    = outboxtest.CrashAfterAck
	crashAfterCommit = inboxtest.CrashAfterCommit
	crashAfterEffect = inboxtest.CrashAfterEffect
)

// fail records err on row and returns it.
func fail(row Row, err error) Row {
	row.Error = err.Error()
	return row
}

// absorbed is the duplicates billing's and the shim's inboxes counted.
func (p *Platform) absorbed() int {
	n := 0.0
	for _, pr := range append(slices.Clone(p.Billings), p.Shims...) {
		n += pr.Counter("inbox_duplicates_total")
	}
	return int(n)
}

// endToEnd adds the checks every load proof makes of its audit.
func endToEnd(row *Row, a Audit) {
	row.Orders, row.Lost, row.Duplicated = a.Orders, a.Lost(), a.DuplicateEffects
	row.check(a.AcceptedMissing == 0, "every order the API acknowledged is committed (%d of %d missing)", a.AcceptedMissing, a.Accepted)
	row.check(a.OrdersWithoutCharge == 0, "every committed order was charged by billing (%d of %d never arrived)", a.OrdersWithoutCharge, a.Orders)
	row.check(a.ChargesWithoutOrder == 0, "no charge without its order (%d)", a.ChargesWithoutOrder)
	row.check(a.ChargesWithoutSettlement == 0, "every charge was settled by the third party (%d of %d not)", a.ChargesWithoutSettlement, a.Charges)
	row.check(a.DuplicateEffects == 0, "no order was captured twice, in billing's events or the ledger (%d extra)", a.DuplicateEffects)
	row.check(a.LedgerDuplicateKeys == 0, "the ledger booked no idempotency key twice (%d)", a.LedgerDuplicateKeys)
	row.check(a.OrdersPending == 0 && a.BillingPending == 0, "both outboxes drained (%d and %d pending)", a.OrdersPending, a.BillingPending)
}

// placeAndSettle places the profile's orders on p, four at a time and
// unpaced, and waits until p is quiet: the calm start of a proof whose fault
// comes afterwards. The driver knows the orders the API accepted.
func (h *Harness) placeAndSettle(ctx context.Context, p *Platform) (*Driver, error) {
	d := newDriver(p.API.URL(), p.Name)
	h.logf("  placing %d orders …", h.prof.Orders)
	d.Drive(ctx, 4, 0, h.prof.Orders, h.prof.Orders, nil)
	_, err := p.waitQuiet(ctx, h.prof.Stable)
	return d, err
}

// settleAndAudit waits until p is quiet and audits it.
func (h *Harness) settleAndAudit(ctx context.Context, p *Platform, d *Driver) (Audit, time.Time, error) {
	accepted, gaveUp, retries := d.Stats()
	h.logf("  load done: %d orders acknowledged (%d client retries, %d given up); waiting until quiet …", accepted, retries, gaveUp)
	quietAt, err := p.waitQuiet(ctx, h.prof.Stable)
	if err != nil {
		return Audit{}, quietAt, err
	}
	a, err := p.audit(ctx, d.Accepted())
	return a, quietAt, err
}

// atomicity: orders is killed between the business write and the commit
// (naive: between the commit and the produce), again and again, under load.
func (h *Harness) atomicity(ctx context.Context, naive bool) Row {
	var row Row
	mode, name := "outbox", "atomicity"
	if naive {
		mode, name = "naive", "atomicity-naive"
	}
	p, err := h.newPlatform(ctx, name, Setup{PublishMode: mode, OrdersArm: arm(crashAfterWrite, h.prof.Crashes, 8)})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	d := newDriver(p.API.URL(), p.Name)
	h.logf("  placing orders until orders has crashed %d times at %s …", h.prof.Crashes, crashAfterWrite)
	d.Drive(ctx, 6, 0, h.prof.Orders, h.prof.Orders*30, func() bool { return p.API.Crashes() >= h.prof.Crashes })
	a, quietAt, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	row.Faults, row.Absorbed = p.API.Crashes(), p.absorbed()
	row.FaultsDesc = fmt.Sprintf("%d SIGKILLs of orders at %s", row.Faults, crashAfterWrite)
	row.RecoverySeconds = recoverySince(p.API.LastKill(), quietAt)
	row.check(row.Faults >= h.prof.Crashes, "orders was killed at least %d times (%d)", h.prof.Crashes, row.Faults)
	if !naive {
		row.check(a.EventlessOrders == 0, "no order without its OrderPlaced event (%d)", a.EventlessOrders)
		row.check(a.OrphanEvents == 0, "no OrderPlaced event without its order (%d)", a.OrphanEvents)
	}
	endToEnd(&row, a)
	return row
}

// relayCrash: the relay is killed after the broker's ack and before it marks
// the rows published, again and again: everything arrives, and the
// republished duplicates are absorbed (naive consumer: applied twice).
func (h *Harness) relayCrash(ctx context.Context, naive bool) Row {
	if h.relayMode == "debezium" && !naive {
		return h.relayCrashDebezium(ctx)
	}
	var row Row
	mode, name := "inbox", "relay-crash"
	if naive {
		mode, name = "naive", "relay-crash-naive"
	}
	p, err := h.newPlatform(ctx, name, Setup{InboxMode: mode, OrdersArm: arm(crashAfterAck, h.prof.Crashes, 3)})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	d := newDriver(p.API.URL(), p.Name)
	h.logf("  placing orders until the relay has crashed %d times at %s …", h.prof.Crashes, crashAfterAck)
	d.Drive(ctx, 3, 40, h.prof.Orders, h.prof.Orders*30, func() bool { return p.API.Crashes() >= h.prof.Crashes })
	a, quietAt, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	row.Faults, row.Absorbed = p.API.Crashes(), p.absorbed()
	row.FaultsDesc = fmt.Sprintf("%d SIGKILLs of the orders relay at %s", row.Faults, crashAfterAck)
	row.RecoverySeconds = recoverySince(p.API.LastKill(), quietAt)
	row.check(row.Faults >= h.prof.Crashes, "the relay was killed at least %d times (%d)", h.prof.Crashes, row.Faults)
	row.check(a.EventlessOrders == 0, "no order without its event (%d)", a.EventlessOrders)
	row.check(row.Absorbed > 0, "republished duplicates reached the consumers and were absorbed (%d)", row.Absorbed)
	endToEnd(&row, a)
	return row
}

func recoverySince(fault, quiet time.Time) float64 {
	if fault.IsZero() || quiet.Before(fault) {
		return 0
	}
	return quiet.Sub(fault).Seconds()
}
