package prove

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/platform/kafkautil"
)

// redelivery: an independent Kafka client re-produces every consumed event
// again and again while billing is killed after its database commit and
// before its offset commit: exactly one charge and one settlement per order.
func (h *Harness) redelivery(ctx context.Context, naive bool) Row {
	var row Row
	mode, name := "inbox", "redelivery"
	if naive {
		mode, name = "naive", "redelivery-naive"
	}
	// Billing is armed only once the redeliveries start, so that its crashes
	// land among them.
	var redelivering atomic.Bool
	crashes := arm(crashAfterCommit, h.prof.Crashes, 2)
	billingArm := func() map[string]string {
		if !redelivering.Load() {
			return map[string]string{"CRASH_POINT": "none", "CRASH_AFTER": "1"}
		}
		return crashes()
	}
	p, err := h.newPlatform(ctx, name, Setup{InboxMode: mode, BillingArm: billingArm})
	if err != nil {
		return fail(row, err)
	}
	defer p.Close()
	d, err := h.placeAndSettle(ctx, p)
	if err != nil {
		return fail(row, err)
	}
	brokers := h.stack.Brokers()
	consumed, err := readTopic(ctx, brokers, p.OrdersTopic)
	if err != nil {
		return fail(row, err)
	}
	events := map[string]bool{}
	for _, m := range consumed {
		events[headerValue(m, event.HeaderEventID)] = true
	}
	w := kafkautil.NewWriter(brokers, 500)
	defer w.Close()
	redelivering.Store(true)
	p.Billing.Kill() // restarts armed; this kill -9 counts among the crashes
	rounds, redelivered := 0, 0
	for rounds < h.prof.Redeliveries || (p.Billing.Crashes() < h.prof.Crashes && rounds < 6*h.prof.Redeliveries) {
		rounds++
		again := make([]kafka.Message, len(consumed))
		for i, m := range consumed {
			again[i] = kafka.Message{Topic: p.OrdersTopic, Key: m.Key, Value: m.Value, Headers: m.Headers}
		}
		if err := w.WriteMessages(ctx, again...); err != nil {
			return fail(row, fmt.Errorf("re-producing: %w", err))
		}
		redelivered += len(again)
		// A crash after the commit leaves the batch's offsets uncommitted, so
		// billing gets the same batch again until its crash budget is spent:
		// each crash costs a restart and a group rejoin (about 10s).
		err := waitUntil(ctx, 3*time.Minute+time.Duration(h.prof.Crashes)*20*time.Second, func() bool {
			lag, err := groupLag(ctx, brokers, p.BillingGroup, p.OrdersTopic)
			return err == nil && lag == 0
		})
		if err != nil {
			return fail(row, fmt.Errorf("billing did not catch up with redelivery round %d (crashed %d times): %w", rounds, p.Billing.Crashes(), err))
		}
		h.logf("  redelivery round %d: %d events re-produced; billing crashed %d times so far", rounds, len(again), p.Billing.Crashes())
	}
	a, quietAt, err := h.settleAndAudit(ctx, p, d)
	if err != nil {
		return fail(row, err)
	}
	row.Faults, row.Absorbed = p.Billing.Crashes()+redelivered, p.absorbed()
	row.FaultsDesc = fmt.Sprintf("%d SIGKILLs of billing (the first from the harness, the others at %s) during the redeliveries, %d events re-produced (%d rounds of %d)",
		p.Billing.Crashes(), crashAfterCommit, redelivered, rounds, len(consumed))
	row.RecoverySeconds = recoverySince(p.Billing.LastKill(), quietAt)
	row.check(p.Billing.Crashes() >= h.prof.Crashes, "billing was killed at least %d times (%d)", h.prof.Crashes, p.Billing.Crashes())
	row.check(rounds >= h.prof.Redeliveries, "every event was re-produced at least %d times (%d)", h.prof.Redeliveries, rounds)
	row.check(a.BillingInboxRows == len(events), "billing's inbox holds exactly one row per event (%d rows, %d events)", a.BillingInboxRows, len(events))
	row.check(row.Absorbed > 0, "the redeliveries were counted as duplicates (%d counted, %d re-produced)", row.Absorbed, redelivered)
	row.check(a.Charges == a.Orders, "exactly one charge per order (%d charges, %d orders)", a.Charges, a.Orders)
	endToEnd(&row, a)
	return row
}

func headerValue(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
