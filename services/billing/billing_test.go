package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
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

// batchSpy counts the batches billing handled at once.
type batchSpy struct {
	*billing.Billing
	batches, events int
}

func (s *batchSpy) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Applying) error {
	s.batches++
	s.events += len(evs)
	return s.Billing.HandleBatch(ctx, tx, evs)
}

type chargeRow struct {
	Order   uuid.UUID
	Status  string
	Version int64
}

type paymentRow struct {
	EventType, Aggregate, Causation string
	Version                         int64
}

// written is what billing wrote, in the order the payment events were.
func written(t *testing.T, pool *pgxpool.Pool) ([]chargeRow, []paymentRow) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT order_id, status, version FROM charges ORDER BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	charges, err := pgx.CollectRows(rows, pgx.RowToStructByPos[chargeRow])
	if err != nil {
		t.Fatal(err)
	}
	var payments []paymentRow
	for _, e := range outboxtest.Enqueued(t, pool, outboxtest.Match{}) {
		payments = append(payments, paymentRow{e.EventType, e.AggregateID, e.CausationID, e.AggregateVersion})
	}
	return charges, payments
}

// HandleBatch writes what Handle writes one event at a time, in the same
// order: new charges and their payments, a re-emitted OrderPlaced absorbed,
// a refund after its capture, an unknown event type ignored; a poison in
// the batch fails it, and the inbox settles it event by event (the poison
// dead-lettered, the rest applied).
func TestHandleBatchWritesWhatHandleWritesOneByOne(t *testing.T) {
	t.Parallel()
	o1, o2, o3 := uuid.New(), uuid.New(), uuid.New()
	first := []event.Envelope{placed(o1), placed(o2), placed(o1), cancelled(o1),
		orderEvent("OrderShipped", o2, 3, `{}`), placed(o3)}
	poisoned := []event.Envelope{placed(uuid.New()), cancelled(uuid.New()), placed(o2)}
	// The guard's opt-ins (skip the stale re-emission, accept the gap to
	// v3): this test compares the handlers, not the guard; by default both
	// would be dead-lettered before either handler saw them (pkg/inbox).
	cfg := inbox.Config{Name: "billing", SkipStale: true, AcceptGaps: true}

	one, onePool := newBilling(t)
	var oneDead int
	for _, evs := range [][]event.Envelope{first, poisoned} {
		for _, ev := range evs {
			oneDead += len(inboxtest.Deliver(t, onePool, cfg, one.Handle, ev))
		}
	}
	b, batchPool := newBilling(t)
	spy := &batchSpy{Billing: b}
	if dl := inboxtest.DeliverBatched(t, batchPool, cfg, spy, first...); len(dl) != 0 {
		t.Fatalf("%d dead letters from a batch without poison", len(dl))
	}
	// The version guard skips the re-emitted OrderPlaced (version 1 again)
	// before any handler sees it.
	if spy.batches != 1 || spy.events != len(first)-1 {
		t.Fatalf("HandleBatch saw %d batches of %d events in all, want 1 of %d", spy.batches, spy.events, len(first)-1)
	}
	batchDead := len(inboxtest.DeliverBatched(t, batchPool, cfg, spy, poisoned...))
	if oneDead != 1 || batchDead != 1 {
		t.Fatalf("dead letters: %d one by one, %d batched; want 1 each (the refund without a charge)", oneDead, batchDead)
	}

	wantCharges, wantPayments := written(t, onePool)
	gotCharges, gotPayments := written(t, batchPool)
	if !slices.Equal(gotCharges, wantCharges) {
		t.Errorf("charges batched %+v, one by one %+v", gotCharges, wantCharges)
	}
	if !slices.Equal(gotPayments, wantPayments) {
		t.Errorf("payment events batched %+v, one by one %+v", gotPayments, wantPayments)
	}
	if len(wantPayments) != 5 {
		t.Fatalf("%d payment events one by one, want 5 (four captures, one refund)", len(wantPayments))
	}
}

// An order placed twice in one batch (two event ids, a consumer without the
// version guard) is charged once, by the first.
func TestHandleBatchChargesAnOrderPlacedTwiceOnce(t *testing.T) {
	t.Parallel()
	b, pool := newBilling(t)
	orderID := uuid.New()
	firstEv, again := placed(orderID), placed(orderID)
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return b.HandleBatch(context.Background(), tx, []inbox.Applying{
			{Ctx: context.Background(), Event: firstEv}, {Ctx: context.Background(), Event: again}})
	})
	if err != nil {
		t.Fatal(err)
	}
	charges, payments := written(t, pool)
	if len(charges) != 1 || len(payments) != 1 || payments[0].Causation != firstEv.EventID.String() {
		t.Fatalf("charges %+v, payments %+v; want one of each, caused by the first event", charges, payments)
	}
}

// Issue 32: a charge redone after billing lost its record of the first one
// (an asynchronous Postgres failover took back billing's last commits, and
// orders.events delivered the OrderPlaced again) is the same payment: the
// same payment id and the same PaymentCaptured event id, which the shim
// sends as the Idempotency-Key. A fresh id each time made it a second
// capture of the order under another key, which the third party booked.
// Each database here is one of the two lives of billing's; one by one and
// batched alike.
func TestARedoneChargeIsTheSamePaymentUnderTheSameKey(t *testing.T) {
	t.Parallel()
	place := placed(uuid.New())
	orderID := uuid.MustParse(place.AggregateID)
	type payment struct{ paymentID, eventID uuid.UUID }
	var lives []payment
	for i := range 4 {
		b, pool := newBilling(t)
		if i%2 == 0 {
			if err := handle(t, b, pool, place); err != nil {
				t.Fatal(err)
			}
		} else if dl := inboxtest.DeliverBatched(t, pool, inbox.Config{Name: "billing"}, b, place); len(dl) != 0 {
			t.Fatalf("dead letters: %+v", dl)
		}
		c, err := b.Charge(context.Background(), orderID)
		if err != nil {
			t.Fatal(err)
		}
		evs := outboxtest.Enqueued(t, pool, outboxtest.Match{})
		if len(evs) != 1 {
			t.Fatalf("%d payment events, want 1", len(evs))
		}
		lives = append(lives, payment{c.PaymentID, evs[0].EventID})
	}
	for i, l := range lives[1:] {
		if l != lives[0] {
			t.Fatalf("redo %d: payment id %s, event id %s; the first time: %s, %s (a second capture under another key)",
				i+1, l.paymentID, l.eventID, lives[0].paymentID, lives[0].eventID)
		}
	}
}
