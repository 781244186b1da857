package shim

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/pgerr"
)

// The store's named errors. The code above the store matches these with
// errors.Is and never sees pgx's errors or a SQLSTATE; the driver's error
// stays in the chain behind the name, for the log and for the inbox, whose
// outage and poison checks (pgerr.IsUnavailable, pgerr.IsPermanent) read
// it. The shim has no API of its own, so none of them is an apperr.
var (
	// ErrNotFound: no forward is recorded for that event.
	ErrNotFound = errors.New("no such forward")
	// ErrDuplicate: a forward of that event is recorded already (SQLSTATE
	// 23505 on event_id): another delivery of it committed first.
	ErrDuplicate = errors.New("forward already recorded")
	// ErrUnavailable: the database cannot be reached or cannot serve now
	// (pgerr.IsUnavailable); the inbox waits the outage out.
	ErrUnavailable = errors.New("the shim database is unavailable")
	// ErrInvalidData: Postgres refused a value (pgerr.IsPermanent); the
	// inbox dead-letters the event.
	ErrInvalidData = errors.New("the database refused a value")
)

var storeErrors = pgerr.StoreErrors{NotFound: ErrNotFound, Duplicate: ErrDuplicate, Unavailable: ErrUnavailable, Invalid: ErrInvalidData}

// The SQL the shim runs on its own table; the inbox's tables are the
// inbox's business.
const (
	sqlInsertForwards = `
		INSERT INTO forwards (event_id, event_type, order_id, kind, outcome)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[])`
	sqlSelectForward = `
		SELECT event_id, event_type, order_id, kind, outcome, forwarded_at
		FROM forwards WHERE event_id = $1`
	sqlCountForwards = `SELECT count(*) FROM forwards`
)

// Forward is the shim's record of one payment event it forwarded to the
// third party. Its field order is the column order of sqlSelectForward.
type Forward struct {
	EventID   uuid.UUID
	EventType string
	OrderID   uuid.UUID
	// Kind is thirdparty.KindCapture or thirdparty.KindRefund.
	Kind string
	// Outcome is lease.Sent (this delivery made the call) or
	// lease.AlreadyPresent (an earlier one had).
	Outcome string
	// ForwardedAt is set by the database when the forward is recorded.
	ForwardedAt time.Time
}

// DB is what the reads run on: a *pgxpool.Pool, a pgx.Tx or a *pgx.Conn.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// InsertForwards records fs in tx, the inbox's transaction that marks their
// messages done, in one statement. ErrDuplicate: one of them is recorded
// already (another delivery of it committed first).
func InsertForwards(ctx context.Context, tx pgx.Tx, fs []Forward) error {
	n := len(fs)
	// [16]byte, not uuid.UUID: pgx encodes it natively instead of through text.
	ids, types, orders, kinds, outcomes := make([][16]byte, n), make([]string, n), make([][16]byte, n), make([]string, n), make([]string, n)
	for i, f := range fs {
		ids[i], types[i], orders[i], kinds[i], outcomes[i] = f.EventID, f.EventType, f.OrderID, f.Kind, f.Outcome
	}
	_, err := tx.Exec(ctx, sqlInsertForwards, ids, types, orders, kinds, outcomes)
	return storeErrors.Translate("recording forwards", err)
}

// ReadForward returns the forward of eventID, or ErrNotFound.
func ReadForward(ctx context.Context, db DB, eventID uuid.UUID) (Forward, error) {
	rows, err := db.Query(ctx, sqlSelectForward, eventID)
	if err != nil {
		return Forward{}, storeErrors.Translate("reading forward", err)
	}
	f, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Forward])
	return f, storeErrors.Translate("reading forward", err)
}

// CountForwards returns how many forwards are recorded.
func CountForwards(ctx context.Context, db DB) (int, error) {
	var n int
	err := db.QueryRow(ctx, sqlCountForwards).Scan(&n)
	return n, storeErrors.Translate("counting forwards", err)
}
