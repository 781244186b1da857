package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/outbox/outboxtest"
	"github.com/onceflow/onceflow/platform/testinfra"
	"github.com/onceflow/onceflow/services/billing"
)

func newBilling(t *testing.T) (*billing.Billing, *pgxpool.Pool) {
	t.Helper()
	pool := testinfra.NewPool(t, billingDatabase(t))
	return billing.New(pool, slog.New(slog.NewTextHandler(io.Discard, nil)), nil), pool
}

func orderEvent(eventType string, orderID uuid.UUID, version int64, payload string) event.Envelope {
	return event.Envelope{
		EventID: uuid.New(), EventType: eventType, EventVersion: 1,
		AggregateType: "order", AggregateID: orderID.String(), AggregateVersion: version,
		OccurredAt: time.Now(), CorrelationID: "corr", Payload: json.RawMessage(payload),
	}
}

func placed(orderID uuid.UUID) event.Envelope {
	return orderEvent(billing.EventOrderPlaced, orderID, 1,
		`{"orderId":"`+orderID.String()+`","customerId":"c1","amountCents":500,"currency":"EUR","placedAt":"2026-01-01T00:00:00Z"}`)
}

func cancelled(orderID uuid.UUID) event.Envelope {
	return orderEvent(billing.EventOrderCancelled, orderID, 2, `{"orderId":"`+orderID.String()+`"}`)
}

// handle runs one event through b.Handle in its own transaction, as the inbox would.
func handle(t *testing.T, b *billing.Billing, pool *pgxpool.Pool, ev event.Envelope) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return b.Handle(context.Background(), tx, ev)
	})
}

type emitted struct {
	EventType string
	Version   int64
	Causation string
}

func outboxEvents(t *testing.T, pool *pgxpool.Pool) []emitted {
	t.Helper()
	var evs []emitted
	for _, e := range outboxtest.Enqueued(t, pool, outboxtest.Match{}) {
		evs = append(evs, emitted{e.EventType, e.AggregateVersion, e.CausationID})
	}
	return evs
}

func TestCaptureThenRefund(t *testing.T) {
	t.Parallel()
	b, pool := newBilling(t)
	orderID := uuid.New()
	place, cancel := placed(orderID), cancelled(orderID)
	if err := handle(t, b, pool, place); err != nil {
		t.Fatal(err)
	}
	if err := handle(t, b, pool, cancel); err != nil {
		t.Fatal(err)
	}
	c, err := b.Charge(context.Background(), orderID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != billing.StatusRefunded || c.Version != 2 || c.AmountCents != 500 || c.RefundedAt == nil {
		t.Fatalf("charge = %+v", c)
	}
	got := outboxEvents(t, pool)
	want := []emitted{
		{billing.EventPaymentCaptured, 1, place.EventID.String()},
		{billing.EventPaymentRefunded, 2, cancel.EventID.String()},
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("outbox = %+v, want %+v", got, want)
	}
	// Each payment says when the order event behind it occurred, for the
	// commit-to-settlement lag downstream.
	payments := outboxtest.Enqueued(t, pool, outboxtest.Match{})
	for i, cause := range []event.Envelope{place, cancel} {
		var p billing.Payment
		if err := json.Unmarshal(payments[i].Payload, &p); err != nil {
			t.Fatal(err)
		}
		if !p.OrderEventAt.Equal(cause.OccurredAt) {
			t.Errorf("%s: orderEventAt = %v, want the order event's occurredAt %v", want[i].EventType, p.OrderEventAt, cause.OccurredAt)
		}
	}
}

func TestAReEmittedOrderPlacedChargesOnce(t *testing.T) {
	t.Parallel()
	b, pool := newBilling(t)
	orderID := uuid.New()
	// Same order, two different event ids: the inbox cannot tell, the
	// charges table's key on order_id can.
	for range 2 {
		if err := handle(t, b, pool, placed(orderID)); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM charges").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d charges (err %v), want 1", n, err)
	}
	if got := outboxEvents(t, pool); len(got) != 1 {
		t.Fatalf("%d payment events, want 1", len(got))
	}
}

func TestPermanentFailures(t *testing.T) {
	t.Parallel()
	b, pool := newBilling(t)
	orderID := uuid.New()
	v2 := placed(orderID)
	v2.EventVersion = 2
	tests := map[string]event.Envelope{
		"unknown version":        v2,
		"cancel without charge":  cancelled(uuid.New()),
		"payload misses amount":  orderEvent(billing.EventOrderPlaced, orderID, 1, `{"orderId":"`+orderID.String()+`","customerId":"c","currency":"EUR"}`),
		"payload of wrong types": orderEvent(billing.EventOrderPlaced, orderID, 1, `{"orderId":42}`),
	}
	for name, ev := range tests {
		t.Run(name, func(t *testing.T) {
			err := handle(t, b, pool, ev)
			if !errors.Is(err, inbox.ErrPermanent) && !errors.Is(err, event.ErrInvalid) {
				t.Fatalf("err = %v, want a permanent error for the dead-letter topic", err)
			}
		})
	}
	if got := outboxEvents(t, pool); len(got) != 0 {
		t.Fatalf("failed events emitted %+v", got)
	}
}

func TestUnknownEventTypesAreIgnored(t *testing.T) {
	t.Parallel()
	b, pool := newBilling(t)
	if err := handle(t, b, pool, orderEvent("OrderShipped", uuid.New(), 3, `{}`)); err != nil {
		t.Fatalf("err = %v, want nil: new event types must not block the partition", err)
	}
}

// Through the inbox, as the consumer runs it: a redelivered OrderPlaced is
// a no-op, and an event billing can never handle is dead-lettered with
// nothing written.
func TestThroughTheInboxARedeliveryIsANoOpAndAPoisonIsDeadLettered(t *testing.T) {
	t.Parallel()
	b, pool := newBilling(t)
	cfg := inbox.Config{Name: "billing"}
	place := placed(uuid.New())
	if dl := inboxtest.Deliver(t, pool, cfg, b.Handle, place, place); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	inboxtest.Deliver(t, pool, cfg, b.Handle, place)
	inboxtest.RequireProcessed(t, pool, "billing", place.EventID)
	outboxtest.RequireEnqueued(t, pool, outboxtest.Match{EventType: billing.EventPaymentCaptured})

	poison := cancelled(uuid.New()) // no charge to refund
	if dl := inboxtest.Deliver(t, pool, cfg, b.Handle, poison); len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	inboxtest.RequireStatus(t, pool, "billing", poison.EventID, "dead_lettered")
	outboxtest.RequireNotEnqueued(t, pool, outboxtest.Match{EventType: billing.EventPaymentRefunded})
}
