package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/inbox"
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
}

// ThirdParty is the part of the reconciler's client the shim needs.
type ThirdParty interface {
	Lookup(ctx context.Context, key string) (bool, error)
	Settle(ctx context.Context, key string, req thirdparty.SettleRequest) (thirdparty.Settlement, error)
}

// Shim forwards payments to the third party.
type Shim struct {
	tp     ThirdParty
	logger *slog.Logger
}

// New returns a shim forwarding to tp.
func New(tp ThirdParty, logger *slog.Logger) *Shim { return &Shim{tp: tp, logger: logger} }

// Handle is the inbox handler for billing.events.
func (s *Shim) Handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	kind, ok := kindOf[ev.EventType]
	if !ok {
		s.logger.InfoContext(ctx, "shim ignores this event type", slog.String("event_type", ev.EventType),
			slog.String("event_id", ev.EventID.String()))
		return nil
	}
	if ev.EventVersion != 1 {
		return inbox.Permanent(fmt.Errorf("%s version %d is unknown to the shim (knows 1)", ev.EventType, ev.EventVersion))
	}
	var p payment
	if err := ev.DecodePayload(&p); err != nil {
		return err
	}
	if p.PaymentID == uuid.Nil || p.OrderID == uuid.Nil || p.AmountCents <= 0 || len(p.Currency) != 3 {
		return inbox.Permanent(fmt.Errorf("%s %s: payload misses paymentId, orderId, a positive amountCents or currency", ev.EventType, ev.EventID))
	}

	key := ev.EventID.String()
	outcome, settlementID := "already_present", ""
	found, err := s.tp.Lookup(ctx, key)
	if err != nil {
		return fmt.Errorf("asking the reconciler about %s: %w", key, err) // retried
	}
	if !found {
		st, err := s.tp.Settle(ctx, key, thirdparty.SettleRequest{
			PaymentID: p.PaymentID.String(), OrderID: p.OrderID.String(), Kind: kind,
			AmountCents: p.AmountCents, Currency: p.Currency,
		})
		if errors.Is(err, thirdparty.ErrRejected) {
			return inbox.Permanent(err)
		}
		if err != nil {
			// Retried; the retry's Lookup tells whether this call landed anyway.
			return fmt.Errorf("forwarding %s: %w", key, err)
		}
		outcome, settlementID = "sent", st.ID
	} else {
		s.logger.WarnContext(ctx, "the reconciler already has this payment; recording it without forwarding again",
			slog.String("event_id", key), slog.String("order_id", p.OrderID.String()))
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO forwards (event_id, event_type, order_id, kind, outcome, settlement_id)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''))`,
		ev.EventID, ev.EventType, p.OrderID, kind, outcome, settlementID)
	if err != nil {
		return fmt.Errorf("recording forward: %w", err)
	}
	return nil
}
