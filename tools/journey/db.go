package journey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/inbox/inboxadmin"
	"github.com/onceflow/onceflow/pkg/outbox/outboxadmin"
)

// The services' own tables, whose stores export no such reads (as in
// tools/reconcile); the outbox's and the inbox's tables are read through
// outboxadmin.EventsOf and inboxadmin.MessagesOf. $1 is the order id.
const (
	sqlOrder = `
		SELECT id::text, status, customer_id, amount_cents, currency, version, created_at, updated_at
		  FROM orders WHERE id = $1`
	sqlCharge = `
		SELECT payment_id::text, status, amount_cents, currency, captured_at, refunded_at
		  FROM charges WHERE order_id = $1`
	sqlForwards = `
		SELECT event_id::text, event_type, kind, outcome, coalesce(settlement_id, ''), forwarded_at
		  FROM forwards WHERE order_id = $1 ORDER BY forwarded_at`
)

type charge struct {
	paymentID, status string
	amountCents       int64
	currency          string
	capturedAt        time.Time
	refundedAt        *time.Time
}

type forward struct {
	eventID, eventType, kind, outcome, settlementID string
	at                                              time.Time
}

// databases reads the three databases.
func (r *reader) databases(ctx context.Context) error {
	var o Order
	err := r.src.Orders.QueryRow(ctx, sqlOrder, r.j.OrderID).Scan(&o.ID, &o.Status, &o.CustomerID, &o.AmountCents,
		&o.Currency, &o.Version, &o.CreatedAt, &o.UpdatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("reading the order: %w", err)
	default:
		r.j.Order = &o
		r.add(Step{At: o.CreatedAt, Where: "orders db", What: fmt.Sprintf("order placed: %s for customer %s", money(o.AmountCents, o.Currency), o.CustomerID), State: "placed"})
		if o.Status == "cancelled" {
			r.add(Step{At: o.UpdatedAt, Where: "orders db", What: "order cancelled", State: o.Status})
		}
	}
	if r.ordersEvents, err = outboxadmin.EventsOf(ctx, r.src.Orders, r.j.OrderID); err != nil {
		return fmt.Errorf("reading orders' outbox: %w", err)
	}
	if r.billingEvents, err = outboxadmin.EventsOf(ctx, r.src.Billing, r.j.OrderID); err != nil {
		return fmt.Errorf("reading billing's outbox: %w", err)
	}
	if r.billingInbox, err = inboxadmin.MessagesOf(ctx, r.src.Billing, r.j.OrderID); err != nil {
		return fmt.Errorf("reading billing's inbox: %w", err)
	}
	if r.shimInbox, err = inboxadmin.MessagesOf(ctx, r.src.Shim, r.j.OrderID); err != nil {
		return fmt.Errorf("reading the shim's inbox: %w", err)
	}
	for _, e := range r.ordersEvents {
		r.outboxSteps("orders db", e)
	}
	for _, e := range r.billingEvents {
		r.outboxSteps("billing db", e)
	}
	for _, m := range r.billingInbox {
		r.inboxSteps("billing db", m)
	}
	for _, m := range r.shimInbox {
		r.inboxSteps("shim db", m)
	}

	var c charge
	err = r.src.Billing.QueryRow(ctx, sqlCharge, r.j.OrderID).Scan(&c.paymentID, &c.status, &c.amountCents, &c.currency,
		&c.capturedAt, &c.refundedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("reading the charge: %w", err)
	default:
		r.charge = &c
		r.add(Step{At: c.capturedAt, Where: "billing db", What: fmt.Sprintf("charge captured: payment %s, %s", c.paymentID, money(c.amountCents, c.currency)),
			EventID: r.consumed(r.billingInbox, "OrderPlaced"), State: "captured"})
		if c.refundedAt != nil {
			r.add(Step{At: *c.refundedAt, Where: "billing db", What: "charge refunded", EventID: r.consumed(r.billingInbox, "OrderCancelled"), State: c.status})
		}
	}

	rows, err := r.src.Shim.Query(ctx, sqlForwards, r.j.OrderID)
	if err != nil {
		return fmt.Errorf("reading the shim's forwards: %w", err)
	}
	r.forwards, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (forward, error) {
		var f forward
		err := row.Scan(&f.eventID, &f.eventType, &f.kind, &f.outcome, &f.settlementID, &f.at)
		return f, err
	})
	if err != nil {
		return fmt.Errorf("reading the shim's forwards: %w", err)
	}
	for _, f := range r.forwards {
		what := f.kind + " forwarded to the third party"
		if f.outcome == "already_present" {
			what = f.kind + " found already booked at the third party, not sent again"
		}
		if f.settlementID != "" {
			what += " (settlement " + f.settlementID + ")"
		}
		r.add(Step{At: f.at, Where: "shim db", What: what, EventID: f.eventID, EventType: f.eventType, State: f.outcome})
	}
	return nil
}

// consumed is the id of the message of eventType the inbox rows hold, "".
func (r *reader) consumed(rows []inboxadmin.MessageRecord, eventType string) string {
	for _, m := range rows {
		if m.EventType == eventType {
			return m.MessageID.String()
		}
	}
	return ""
}

func (r *reader) outboxSteps(where string, e outboxadmin.EventRecord) {
	what := fmt.Sprintf("outbox: %s v%d written (row %d)", e.EventType, e.AggregateVersion, e.ID)
	if e.Archived {
		what += ", now archived"
	}
	r.add(Step{At: e.CreatedAt, Where: where, What: what, EventID: e.EventID.String(), EventType: e.EventType, State: e.State})
	if e.PublishedAt != nil {
		r.add(Step{At: *e.PublishedAt, Where: where, What: fmt.Sprintf("outbox: %s marked published after the broker's ack", e.EventType),
			EventID: e.EventID.String(), EventType: e.EventType, State: "published", notAHop: true})
	}
}

func (r *reader) inboxSteps(where string, m inboxadmin.MessageRecord) {
	id := m.MessageID.String()
	r.add(Step{At: m.ReceivedAt, Where: where, What: fmt.Sprintf("inbox %s: %s v%d received from %s/%d@%d (attempts %d)",
		m.Consumer, m.EventType, m.AggregateVersion, m.Topic, m.Partition, m.Offset, m.Attempts),
		EventID: id, EventType: m.EventType, State: m.Status})
	if m.ProcessedAt != nil {
		r.add(Step{At: *m.ProcessedAt, Where: where, What: fmt.Sprintf("inbox %s: %s applied (%s)", m.Consumer, m.EventType, m.Status),
			EventID: id, EventType: m.EventType, State: m.Status})
	}
}

func money(cents int64, currency string) string {
	return fmt.Sprintf("%d.%02d %s", cents/100, cents%100, currency)
}
