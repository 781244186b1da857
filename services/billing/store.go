package billing

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/pgerr"
	"github.com/onceflow/onceflow/platform/apperr"
)

// The store's named errors. The code above the store matches these with
// errors.Is and never sees pgx's errors or a SQLSTATE; the driver's error
// stays in the chain behind the name, for the log and for the inbox, whose
// outage and poison checks (pgerr.IsUnavailable, pgerr.IsPermanent) read
// it.
var (
	// ErrNotFound: the order has no charge (or none in the state asked for).
	ErrNotFound = errors.New("no such charge")
	// ErrDuplicate: a charge with that payment id exists (SQLSTATE 23505 on
	// payment_id). A second charge of an order is not a duplicate: the
	// order_id key absorbs it (InsertCharge reports inserted=false).
	ErrDuplicate = errors.New("payment id already recorded")
	// ErrUnavailable: the database cannot be reached or cannot serve now
	// (pgerr.IsUnavailable). It is an apperr.Unavailable, so the API
	// answers 503 with this message and the cause goes to the log only; the
	// inbox waits the outage out.
	ErrUnavailable = apperr.Errorf(apperr.Unavailable, "the billing database is unavailable; retry later")
	// ErrInvalidData: Postgres refused a value (pgerr.IsPermanent: SQLSTATE
	// class 22 or 54); the same event can never be applied, and the inbox
	// dead-letters it.
	ErrInvalidData = errors.New("the database refused a value")
)

var storeErrors = pgerr.StoreErrors{NotFound: ErrNotFound, Duplicate: ErrDuplicate, Unavailable: ErrUnavailable, Invalid: ErrInvalidData}

// The SQL billing runs. The column list of a charge is the field order of
// Charge, which pgx.RowToStructByPos relies on.
const (
	// The primary key on order_id is the business constraint behind the
	// inbox: an OrderPlaced re-emitted under a new event id charges nothing.
	sqlInsertCharge = `
		INSERT INTO charges (order_id, payment_id, customer_id, amount_cents, currency, status, version, captured_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (order_id) DO NOTHING`
	// sqlInsertCharges is sqlInsertCharge for many charges at once; it
	// returns the orders it charged.
	sqlInsertCharges = `
		INSERT INTO charges (order_id, payment_id, customer_id, amount_cents, currency, status, version, captured_at)
		SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[])
		ON CONFLICT (order_id) DO NOTHING
		RETURNING order_id`
	// The naive mode's capture: every delivery charges again.
	sqlRecaptureCharge = `
		INSERT INTO charges (order_id, payment_id, customer_id, amount_cents, currency, status, version, captured_at)
		VALUES ($1, $2, $3, $4, $5, $6, 1, $7)
		ON CONFLICT (order_id) DO UPDATE
		SET payment_id = EXCLUDED.payment_id, version = charges.version + 1, captured_at = EXCLUDED.captured_at
		RETURNING version`
	sqlRefundCharge = `
		UPDATE charges SET status = $2, version = version + 1, refunded_at = $3
		WHERE order_id = $1 AND status = $4
		RETURNING order_id, payment_id, customer_id, amount_cents, currency, status, version, captured_at, refunded_at`
	sqlSelectChargeStatus = `SELECT status FROM charges WHERE order_id = $1`
	sqlSelectCharge       = `
		SELECT order_id, payment_id, customer_id, amount_cents, currency, status, version, captured_at, refunded_at
		FROM charges WHERE order_id = $1`
)

// Store runs billing's SQL and translates the driver's errors into the named
// errors above. The writes take the inbox's transaction, so that the charge,
// the inbox row and the payment event commit together.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns the store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// InsertCharge records c as captured in tx. inserted is false when the order
// already has a charge: the business constraint absorbed a re-emitted
// OrderPlaced.
func (s *Store) InsertCharge(ctx context.Context, tx pgx.Tx, c Charge) (inserted bool, err error) {
	// [16]byte: pgx encodes it natively (uuid.UUID goes through text).
	tag, err := tx.Exec(ctx, sqlInsertCharge, [16]byte(c.OrderID), [16]byte(c.PaymentID),
		c.CustomerID, c.AmountCents, c.Currency, c.Status, c.Version, c.CapturedAt)
	if err != nil {
		return false, storeErrors.Translate("recording charge", err)
	}
	return tag.RowsAffected() == 1, nil
}

// InsertCharges records cs as captured in tx, in one statement, and returns
// the orders it charged: an order missing from it already had a charge (the
// business constraint absorbed a re-emitted OrderPlaced). cs must not hold
// an order twice.
func (s *Store) InsertCharges(ctx context.Context, tx pgx.Tx, cs []Charge) (inserted map[uuid.UUID]bool, err error) {
	n := len(cs)
	// [16]byte: pgx encodes it natively (uuid.UUID goes through text).
	orders, payments, customers, amounts := make([][16]byte, n), make([][16]byte, n), make([]string, n), make([]int64, n)
	currencies, statuses, versions, at := make([]string, n), make([]string, n), make([]int64, n), make([]time.Time, n)
	for i, c := range cs {
		orders[i], payments[i], customers[i], amounts[i] = c.OrderID, c.PaymentID, c.CustomerID, c.AmountCents
		currencies[i], statuses[i], versions[i], at[i] = c.Currency, c.Status, c.Version, c.CapturedAt
	}
	rows, err := tx.Query(ctx, sqlInsertCharges, orders, payments, customers, amounts, currencies, statuses, versions, at)
	if err != nil {
		return nil, storeErrors.Translate("recording charges", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, storeErrors.Translate("recording charges", err)
	}
	inserted = make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		inserted[id] = true
	}
	return inserted, nil
}

// RecaptureCharge is the naive mode's capture: it records c, or charges the
// order again under c's payment id, and returns the charge's new version.
func (s *Store) RecaptureCharge(ctx context.Context, tx pgx.Tx, c Charge) (version int64, err error) {
	err = tx.QueryRow(ctx, sqlRecaptureCharge, c.OrderID, c.PaymentID, c.CustomerID, c.AmountCents, c.Currency,
		c.Status, c.CapturedAt).Scan(&version)
	return version, storeErrors.Translate("recording charge", err)
}

// RefundCharge marks the order's captured charge refunded at in tx and
// returns it. ErrNotFound: the order has no captured charge (none at all,
// or it is refunded already; ChargeStatus tells which).
func (s *Store) RefundCharge(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, at time.Time) (Charge, error) {
	rows, err := tx.Query(ctx, sqlRefundCharge, orderID, StatusRefunded, at, StatusCaptured)
	if err != nil {
		return Charge{}, storeErrors.Translate("refunding charge", err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Charge])
	return c, storeErrors.Translate("refunding charge", err)
}

// ChargeStatus returns the status of the order's charge, read in tx, or
// ErrNotFound.
func (s *Store) ChargeStatus(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (string, error) {
	var status string
	err := tx.QueryRow(ctx, sqlSelectChargeStatus, orderID).Scan(&status)
	return status, storeErrors.Translate("reading charge status", err)
}

// Charge returns the order's charge, or ErrNotFound.
func (s *Store) Charge(ctx context.Context, orderID uuid.UUID) (Charge, error) {
	rows, err := s.pool.Query(ctx, sqlSelectCharge, orderID)
	if err != nil {
		return Charge{}, storeErrors.Translate("reading charge", err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Charge])
	return c, storeErrors.Translate("reading charge", err)
}
