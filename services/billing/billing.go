package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/cdc"
)

// The order events billing understands (published by the orders service).
const (
	EventOrderPlaced    = "OrderPlaced"
	EventOrderCancelled = "OrderCancelled"
)

// The events billing publishes, on aggregate type "payment" whose id is the
// order id (one payment per order), so a payment's events share a partition.
const (
	AggregateType        = "payment"
	EventPaymentCaptured = "PaymentCaptured"
	EventPaymentRefunded = "PaymentRefunded"
)

// Charge statuses.
const (
	StatusCaptured = "captured"
	StatusRefunded = "refunded"
)

// orderPlaced is billing's reading of the OrderPlaced v1 contract: only the
// fields it needs, so the producer may add others.
type orderPlaced struct {
	OrderID     uuid.UUID `json:"orderId"`
	CustomerID  string    `json:"customerId"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
}

type orderCancelled struct {
	OrderID uuid.UUID `json:"orderId"`
}

// Payment is the v1 payload of PaymentCaptured and PaymentRefunded.
type Payment struct {
	PaymentID   uuid.UUID `json:"paymentId"`
	OrderID     uuid.UUID `json:"orderId"`
	CustomerID  string    `json:"customerId"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	At          time.Time `json:"at"`
	// OrderEventAt is when the order event that caused this payment
	// occurred (the orders commit: OrderPlaced for a capture, OrderCancelled
	// for a refund), so that downstream can measure commit-to-settlement lag.
	OrderEventAt time.Time `json:"orderEventAt"`
}

// Charge is one order's payment.
type Charge struct {
	OrderID     uuid.UUID  `json:"orderId"`
	PaymentID   uuid.UUID  `json:"paymentId"`
	CustomerID  string     `json:"customerId"`
	AmountCents int64      `json:"amountCents"`
	Currency    string     `json:"currency"`
	Status      string     `json:"status"`
	Version     int64      `json:"version"`
	CapturedAt  time.Time  `json:"capturedAt"`
	RefundedAt  *time.Time `json:"refundedAt"`
}

// Billing handles order events; its Store runs the SQL.
type Billing struct {
	store  *Store
	logger *slog.Logger
	now    func() time.Time
	write  cdc.WriteFunc
	queue  cdc.QueueFunc // nil: a batch's events are written one by one
}

// New returns billing on pool; now is the clock (time.Now if nil).
func New(pool *pgxpool.Pool, logger *slog.Logger, now func() time.Time) *Billing {
	if now == nil {
		now = time.Now
	}
	return &Billing{store: NewStore(pool), logger: logger, now: now, write: outbox.Enqueue, queue: outbox.Queue}
}

// WithRelayMode makes billing write its events as mode m's relay reads
// them: cdc.Emit under RELAY_MODE=wal (cdc.Write), into the
// outbox table otherwise.
func (b *Billing) WithRelayMode(m outbox.RelayMode) *Billing {
	b.write, b.queue = cdc.Write(m), cdc.Queue(m)
	return b
}

// HandleNaive is the handler of the naive mode (INBOX_MODE=naive), for the
// fault-injection harness only: what a team writes when it trusts the broker
// to deliver each event once. Every OrderPlaced it receives captures the
// payment again (a fresh payment id, the next version) and publishes another
// PaymentCaptured, so a redelivery charges the customer twice downstream.
// Run it without the inbox (NaiveConsumer) to see that happen.
func (b *Billing) HandleNaive(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.EventType != EventOrderPlaced || ev.EventVersion != 1 {
		return b.Handle(ctx, tx, ev)
	}
	var p orderPlaced
	if err := ev.DecodePayload(&p); err != nil {
		return err
	}
	now := b.now().UTC()
	paymentID := uuid.New()
	version, err := b.store.RecaptureCharge(ctx, tx, Charge{OrderID: p.OrderID, PaymentID: paymentID, CustomerID: p.CustomerID,
		AmountCents: p.AmountCents, Currency: p.Currency, Status: StatusCaptured, CapturedAt: now})
	if err != nil {
		return err
	}
	// A fresh event id too: what the naive mode shows is a redelivery
	// becoming a second, different payment downstream.
	return b.emitAs(ctx, tx, ev, event.NewID(), EventPaymentCaptured, version, Payment{
		PaymentID: paymentID, OrderID: p.OrderID, CustomerID: p.CustomerID,
		AmountCents: p.AmountCents, Currency: p.Currency, At: now,
	})
}

// Handle is the inbox handler for orders.events. It runs in the inbox's
// transaction: the charge, the inbox row and the payment event commit
// together.
func (b *Billing) Handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	switch ev.EventType {
	case EventOrderPlaced:
		p, err := decodePlaced(ev)
		if err != nil {
			return err
		}
		return b.capture(ctx, tx, ev, p)
	case EventOrderCancelled:
		if ev.EventVersion != 1 {
			return unknownVersion(ev)
		}
		var p orderCancelled
		if err := ev.DecodePayload(&p); err != nil {
			return err
		}
		if p.OrderID == uuid.Nil {
			return inbox.Permanent(fmt.Errorf("OrderCancelled %s: payload misses orderId", ev.EventID))
		}
		return b.refund(ctx, tx, ev, p.OrderID)
	default:
		// Producers may add event types; a consumer that does not care about
		// one records it as handled and moves on.
		b.logger.InfoContext(ctx, "billing ignores this event type", slog.String("event_type", ev.EventType),
			slog.String("event_id", ev.EventID.String()))
		return nil
	}
}

// HandleBatch is Handle for the new events of an inbox batch
// (inbox.BatchHandler): a run of OrderPlaced events is charged in one
// statement and their payment events written in one round trip; any other
// event goes through Handle, in its turn. An event Handle would refuse
// fails the batch, which the inbox then settles event by event with Handle.
func (b *Billing) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Applying) error {
	for start := 0; start < len(evs); {
		end := start
		for end < len(evs) && evs[end].Event.EventType == EventOrderPlaced {
			end++
		}
		if end == start {
			if err := b.Handle(evs[start].Ctx, tx, evs[start].Event); err != nil {
				return err
			}
			end++
		} else if err := b.captureAll(ctx, tx, evs[start:end]); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// captureAll is capture for a run of OrderPlaced events, in two statements:
// the charges, then the payment events of those that were new.
func (b *Billing) captureAll(ctx context.Context, tx pgx.Tx, evs []inbox.Applying) error {
	now := b.now().UTC()
	charges := make([]Charge, 0, len(evs))
	causes := make([]inbox.Applying, 0, len(evs))
	orders := make(map[uuid.UUID]bool, len(evs))
	for _, a := range evs {
		p, err := decodePlaced(a.Event)
		if err != nil {
			return err
		}
		if orders[p.OrderID] {
			continue // the same order placed again: its first event charges it, or nothing does
		}
		orders[p.OrderID] = true
		charges = append(charges, Charge{OrderID: p.OrderID, PaymentID: paymentIDOf(a.Event), CustomerID: p.CustomerID,
			AmountCents: p.AmountCents, Currency: p.Currency, Status: StatusCaptured, Version: 1, CapturedAt: now})
		causes = append(causes, a)
	}
	inserted, err := b.store.InsertCharges(ctx, tx, charges)
	if err != nil {
		return err
	}
	var payments []event.Envelope
	for i, c := range charges {
		if !inserted[c.OrderID] {
			continue // already charged: the business constraint absorbed a re-emitted OrderPlaced
		}
		ev, err := b.payment(causes[i].Ctx, causes[i].Event, derivedEventID(causes[i].Event, EventPaymentCaptured), EventPaymentCaptured, 1, Payment{
			PaymentID: c.PaymentID, OrderID: c.OrderID, CustomerID: c.CustomerID,
			AmountCents: c.AmountCents, Currency: c.Currency, At: now, OrderEventAt: causes[i].Event.OccurredAt.UTC(),
		})
		if err != nil {
			return err
		}
		payments = append(payments, ev)
	}
	return b.writeAll(ctx, tx, payments)
}

// writeAll writes evs in one round trip when the relay mode's write can be
// queued, one by one otherwise.
func (b *Billing) writeAll(ctx context.Context, tx pgx.Tx, evs []event.Envelope) error {
	if len(evs) == 0 {
		return nil
	}
	if b.queue == nil {
		for _, ev := range evs {
			if err := b.write(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	}
	var batch pgx.Batch
	if err := b.queue(&batch, evs...); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		return fmt.Errorf("outbox: inserting events: %w", err)
	}
	return nil
}

// decodePlaced reads and checks an OrderPlaced event as Handle does.
func decodePlaced(ev event.Envelope) (orderPlaced, error) {
	var p orderPlaced
	if ev.EventVersion != 1 {
		return p, unknownVersion(ev)
	}
	if err := ev.DecodePayload(&p); err != nil {
		return p, err
	}
	if p.OrderID == uuid.Nil || p.CustomerID == "" || p.AmountCents <= 0 || len(p.Currency) != 3 {
		return p, inbox.Permanent(fmt.Errorf("OrderPlaced %s: payload misses orderId, customerId, a positive amountCents or currency", ev.EventID))
	}
	return p, nil
}

func unknownVersion(ev event.Envelope) error {
	return inbox.Permanent(fmt.Errorf("%s version %d is unknown to billing (knows 1)", ev.EventType, ev.EventVersion))
}

func (b *Billing) capture(ctx context.Context, tx pgx.Tx, cause event.Envelope, p orderPlaced) error {
	now := b.now().UTC()
	paymentID := paymentIDOf(cause)
	inserted, err := b.store.InsertCharge(ctx, tx, Charge{OrderID: p.OrderID, PaymentID: paymentID, CustomerID: p.CustomerID,
		AmountCents: p.AmountCents, Currency: p.Currency, Status: StatusCaptured, Version: 1, CapturedAt: now})
	if err != nil {
		return err
	}
	if !inserted {
		return nil // already charged: the business constraint absorbed a re-emitted OrderPlaced
	}
	return b.emit(ctx, tx, cause, EventPaymentCaptured, 1, Payment{
		PaymentID: paymentID, OrderID: p.OrderID, CustomerID: p.CustomerID,
		AmountCents: p.AmountCents, Currency: p.Currency, At: now, OrderEventAt: cause.OccurredAt.UTC(),
	})
}

func (b *Billing) refund(ctx context.Context, tx pgx.Tx, cause event.Envelope, orderID uuid.UUID) error {
	now := b.now().UTC()
	c, err := b.store.RefundCharge(ctx, tx, orderID, now)
	if errors.Is(err, ErrNotFound) {
		_, err := b.store.ChargeStatus(ctx, tx, orderID)
		if errors.Is(err, ErrNotFound) {
			// Order events share a partition, so the OrderPlaced went first;
			// no charge means it was dead-lettered. Say so rather than guess.
			return inbox.Permanent(fmt.Errorf("OrderCancelled %s: order %s has no charge to refund", cause.EventID, orderID))
		}
		return err // already refunded: nothing to do, or a read error
	}
	if err != nil {
		return err
	}
	return b.emit(ctx, tx, cause, EventPaymentRefunded, c.Version, Payment{
		PaymentID: c.PaymentID, OrderID: orderID, CustomerID: c.CustomerID,
		AmountCents: c.AmountCents, Currency: c.Currency, At: now, OrderEventAt: cause.OccurredAt.UTC(),
	})
}

// paymentIDOf is the payment id of the charge an OrderPlaced causes: derived
// from the event (event.DerivedID), so a charge redone after billing lost its
// record of the first one (a failover that took back its last commits, with
// the OrderPlaced delivered again) is the same payment, not a second one.
func paymentIDOf(placed event.Envelope) uuid.UUID { return event.DerivedID(placed.EventID, "payment") }

// derivedEventID is the id of the eventType event cause leads to: the same
// on every redo, so the shim's inbox, and the Idempotency-Key it sends the
// third party, recognise a redone payment event as the one already seen.
func derivedEventID(cause event.Envelope, eventType string) uuid.UUID {
	return event.DerivedID(cause.EventID, eventType)
}

func (b *Billing) emit(ctx context.Context, tx pgx.Tx, cause event.Envelope, eventType string, version int64, p Payment) error {
	return b.emitAs(ctx, tx, cause, derivedEventID(cause, eventType), eventType, version, p)
}

func (b *Billing) emitAs(ctx context.Context, tx pgx.Tx, cause event.Envelope, id uuid.UUID, eventType string, version int64, p Payment) error {
	ev, err := b.payment(ctx, cause, id, eventType, version, p)
	if err != nil {
		return err
	}
	return b.write(ctx, tx, ev)
}

// payment is the event id of p, caused by cause; ctx is the cause's
// consumer span.
func (b *Billing) payment(ctx context.Context, cause event.Envelope, id uuid.UUID, eventType string, version int64, p Payment) (event.Envelope, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return event.Envelope{}, fmt.Errorf("encoding %s: %w", eventType, err)
	}
	// The inbox runs Handle in the cause's consumer span: the payment event
	// continues the order's trace from there.
	traceparent := event.TraceparentFromContext(ctx)
	if traceparent == "" {
		traceparent = cause.Traceparent
	}
	return event.Envelope{
		EventID:          id,
		EventType:        eventType,
		EventVersion:     1,
		AggregateType:    AggregateType,
		AggregateID:      p.OrderID.String(),
		AggregateVersion: version,
		OccurredAt:       p.At,
		CorrelationID:    cause.CorrelationID,
		CausationID:      cause.EventID.String(),
		Traceparent:      traceparent,
		Payload:          body,
	}, nil
}

// Charge returns the charge of an order, or ErrNotFound.
func (b *Billing) Charge(ctx context.Context, orderID uuid.UUID) (Charge, error) {
	return b.store.Charge(ctx, orderID)
}
