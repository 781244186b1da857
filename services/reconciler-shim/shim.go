package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/lease"
	"github.com/onceflow/onceflow/services/reconciler-shim/thirdparty"
)

// The payment events the shim forwards (published by billing).
const (
	EventPaymentCaptured = "PaymentCaptured"
	EventPaymentRefunded = "PaymentRefunded"
)

var kindOf = map[string]string{
	EventPaymentCaptured: thirdparty.KindCapture,
	EventPaymentRefunded: thirdparty.KindRefund,
}

// payment is the shim's reading of billing's Payment v1 payload.
type payment struct {
	PaymentID   uuid.UUID `json:"paymentId"`
	OrderID     uuid.UUID `json:"orderId"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	// OrderEventAt is when the orders commit behind the payment happened;
	// absent from payments of an older billing.
	OrderEventAt time.Time `json:"orderEventAt"`
}

// ThirdParty is the part of the reconciler's client the shim needs.
type ThirdParty interface {
	Lookup(ctx context.Context, key string) (bool, error)
	Settle(ctx context.Context, key string, req thirdparty.SettleRequest) (thirdparty.Settlement, error)
}

// Shim forwards payments to the third party.
type Shim struct {
	tp      ThirdParty
	logger  *slog.Logger
	metrics *Metrics
	now     func() time.Time
	sent    sentPayments
}

// New returns a shim forwarding to tp.
func New(tp ThirdParty, logger *slog.Logger) *Shim {
	return &Shim{tp: tp, logger: logger, metrics: NewMetrics(nil), now: time.Now}
}

// WithMetrics makes s count its forwards and third-party errors on m, and
// returns s.
func (s *Shim) WithMetrics(m *Metrics) *Shim {
	s.metrics = m
	return s
}

// Effect is the shim's side effect for the inbox's lease mode
// (lease.NewConsumer): the event id is the idempotency key, Check asks
// the reconciler whether it has that key, Call forwards the payment, and
// DoneBatch records a batch's forwards in the inbox's transaction, in one
// statement.
func (s *Shim) Effect() lease.Effect {
	return lease.Effect{Check: s.lookup, Call: s.forward, DoneBatch: s.record}
}

// lookup asks the third party whether it booked key. The inbox decides on
// the class of the error, so the lookup says which one it is:
//   - the third party could not be reached or could not serve (refused,
//     reset, a timeout, 5xx, 408, 429): lease.ErrUnavailable, an outage
//     the inbox waits out without charging the payment;
//   - it answered, but not with "booked" or its own "not found" (another
//     4xx, such as a proxy's bare 404): lease.ErrUnknowable, nobody can
//     tell from it whether an earlier delivery booked the payment, and the
//     inbox records the payment uncertain for the reconciliation report.
func (s *Shim) lookup(ctx context.Context, key string) (bool, error) {
	has, err := s.tp.Lookup(ctx, key)
	if err == nil {
		return has, nil
	}
	s.metrics.callError(OpLookup, err)
	if errors.Is(err, thirdparty.ErrRejected) {
		return false, fmt.Errorf("%w: %w", lease.ErrUnknowable, err)
	}
	return false, unavailable(err)
}

// unavailable marks err, a failed call that did not reach the third party
// or that it could not serve, as the third party's outage.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", lease.ErrUnavailable, err)
}

// request validates a payment event and builds its settlement. ok is false
// for event types the shim does not forward.
func request(ev event.Envelope) (req thirdparty.SettleRequest, p payment, ok bool, err error) {
	kind, ok := kindOf[ev.EventType]
	if !ok {
		return req, p, false, nil
	}
	if ev.EventVersion != 1 {
		return req, p, true, inbox.Permanent(fmt.Errorf("%s version %d is unknown to the shim (knows 1)", ev.EventType, ev.EventVersion))
	}
	if err := ev.DecodePayload(&p); err != nil {
		return req, p, true, err
	}
	if p.PaymentID == uuid.Nil || p.OrderID == uuid.Nil || p.AmountCents <= 0 || len(p.Currency) != 3 {
		return req, p, true, inbox.Permanent(fmt.Errorf("%s %s: payload misses paymentId, orderId, a positive amountCents or currency", ev.EventType, ev.EventID))
	}
	return thirdparty.SettleRequest{
		PaymentID: p.PaymentID.String(), OrderID: p.OrderID.String(), Kind: kind,
		AmountCents: p.AmountCents, Currency: p.Currency,
	}, p, true, nil
}

func (s *Shim) forward(ctx context.Context, ev event.Envelope, key string) error {
	req, p, ok, err := request(ev)
	if err != nil || !ok {
		if !ok {
			s.logger.InfoContext(ctx, "shim ignores this event type", slog.String("event_type", ev.EventType),
				slog.String("event_id", ev.EventID.String()))
		}
		return err
	}
	_, err = s.tp.Settle(ctx, key, req)
	s.metrics.callError(OpSettle, err)
	switch {
	case err == nil:
		s.sent.put(ev, req, p)
		return nil
	case errors.Is(err, thirdparty.ErrRejected):
		return inbox.Permanent(err)
	case !errors.Is(err, thirdparty.ErrUndecodable):
		// A 5xx, 408 or 429, a timeout, no connection: the third party is
		// down or overloaded, which is no payment's fault. The inbox waits
		// it out and, since the call may have landed, checks before calling
		// again.
		return unavailable(fmt.Errorf("forwarding %s: %w", key, err))
	default: // it answered 2xx, but not as the API says: retried, then dead-lettered
		return fmt.Errorf("forwarding %s: %w", key, err)
	}
}

// record runs in the inbox's transaction that marks the message done, right
// after the third party confirmed the settlement (or showed it already had
// it): the moment the payment is settled, as far as the platform can tell.
// The counters are bumped before the commit, so a commit that fails and is
// retried counts the forward twice; that is rare, and only ever over-counts.
// A payment this process just forwarded comes from s.sent, decoded by the
// call; the others (settled by Check, or a retried record) are decoded here.
func (s *Shim) record(ctx context.Context, tx pgx.Tx, done []lease.DoneEvent) error {
	fs := make([]Forward, 0, len(done))
	ps := make([]payment, 0, len(done))
	for _, d := range done {
		req, p, ok := s.sent.take(d.Event)
		if !ok {
			var err error
			if req, p, ok, err = request(d.Event); err != nil {
				return err
			}
			if !ok {
				continue
			}
		}
		fs = append(fs, Forward{EventID: d.Event.EventID, EventType: d.Event.EventType, OrderID: p.OrderID,
			Kind: req.Kind, Outcome: string(d.Outcome)})
		ps = append(ps, p)
	}
	if len(fs) == 0 {
		return nil
	}
	if err := InsertForwards(ctx, tx, fs); err != nil {
		return err
	}
	now := s.now()
	for i, f := range fs {
		s.metrics.forwards.WithLabelValues(f.Kind, f.Outcome).Inc()
		if !ps[i].OrderEventAt.IsZero() {
			s.metrics.lag.WithLabelValues(f.Kind).Observe(now.Sub(ps[i].OrderEventAt).Seconds())
		}
	}
	return nil
}
