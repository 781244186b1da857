package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/pgerr"
	"github.com/onceflow/onceflow/platform/apperr"
)

// The store's named errors. The code above the store matches these with
// errors.Is and never sees pgx's errors or a SQLSTATE; the driver's error
// stays in the chain behind the name, for the log.
var (
	// ErrNotFound: no order (or idempotency key) with that id.
	ErrNotFound = errors.New("not found")
	// ErrDuplicate: the idempotency key is already recorded (SQLSTATE 23505
	// on its primary key), by an earlier request or one committing now.
	ErrDuplicate = errors.New("already recorded")
	// ErrUnavailable: the database cannot be reached or cannot serve now
	// (pgerr.IsUnavailable). It is an apperr.Unavailable, so the API
	// answers 503 with this message and the cause goes to the log only.
	ErrUnavailable = apperr.Errorf(apperr.Unavailable, "the orders database is unavailable; retry later")
	// ErrInvalidData: Postgres refused a value (pgerr.IsPermanent: SQLSTATE
	// class 22 or 54); the same request can never succeed.
	ErrInvalidData = errors.New("the database refused a value")
)

// storeErrors names what each statement can fail with; txErrors leaves
// ErrDuplicate out, so that a unique violation from outside the store (the
// outbox's own insert) is never read as a seen idempotency key.
var (
	storeErrors = pgerr.StoreErrors{NotFound: ErrNotFound, Duplicate: ErrDuplicate, Unavailable: ErrUnavailable, Invalid: ErrInvalidData}
	txErrors    = pgerr.StoreErrors{Unavailable: ErrUnavailable, Invalid: ErrInvalidData}
)

// The SQL the service runs. The column list of an order is the field order
// of Order, which pgx.RowToStructByPos relies on.
const (
	sqlInsertOrder = `
		INSERT INTO orders (id, customer_id, amount_cents, currency, status, version, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
	// No ON CONFLICT: the unique violation is the answer (ErrDuplicate),
	// and a request racing one that holds the same key waits for it to
	// commit or roll back before getting it.
	sqlInsertIdempotencyKey = `
		INSERT INTO idempotency_keys (key, request_hash, order_id) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO NOTHING`
	sqlSelectIdempotencyKey = `
		SELECT request_hash, order_id FROM idempotency_keys WHERE key = $1`
	sqlSelectOrder = `
		SELECT id, customer_id, amount_cents, currency, status, version, created_at, updated_at
		FROM orders WHERE id = $1`
	// The lock serialises changes to one order, so versions never repeat.
	sqlSelectOrderForUpdate = sqlSelectOrder + ` FOR UPDATE`
	sqlUpdateOrder          = `
		UPDATE orders SET status = $2, version = $3, updated_at = $4 WHERE id = $1`
)

// Store runs the orders service's SQL on its database and translates the
// driver's errors into the named errors above. The statements that must
// commit with an event take the caller's transaction (see InTx), so that the
// service can write the event in the same one.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns the store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// InTx runs fn in a transaction, committed when fn returns nil. fn's error
// is returned with its name kept; an outage or refused data met by begin,
// commit or a statement outside the store (the outbox write) is named too.
func (s *Store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return txErrors.Translate("orders transaction", pgx.BeginFunc(ctx, s.pool, fn))
}

// PlaceInPipeline writes a new order, its idempotency key (when key is not
// empty) and what else commits with it (its event) in one transaction, sent
// as one pipeline (a pgx.Batch): BEGIN, every insert and COMMIT in one round
// trip. With a key, the COMMIT waits for a second round trip, since the
// key's insert decides it: a key already recorded rolls the transaction
// back with ErrDuplicate.
//
// build returns the order and queues the rest onto the pipeline; it runs
// once a connection is held, so that the order's times are its
// transaction's, not those of a wait for a connection. beforeCommit runs
// with everything written and nothing committed (the service's crash
// point): between the round trips with a key; without one, before the
// pipeline is sent, which is the same as far as the database can tell. Its
// error rolls back.
//
// It is the write path of POST /orders: a transaction run statement by
// statement took five round trips, which cost the API and Postgres about
// twice the CPU of one or two and held a pool connection that much longer.
func (s *Store) PlaceInPipeline(ctx context.Context, key string, hash []byte,
	build func() (Order, func(*pgx.Batch) error, error), beforeCommit func() error) (Order, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Order{}, txErrors.Translate("orders transaction", err)
	}
	defer conn.Release()
	o, queue, err := build()
	if err != nil {
		return Order{}, err
	}
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(sqlInsertOrder, [16]byte(o.ID), o.CustomerID, o.AmountCents, o.Currency, o.Status, o.Version, o.CreatedAt, o.UpdatedAt)
	if key != "" {
		b.Queue(sqlInsertIdempotencyKey, key, hash, [16]byte(o.ID))
	}
	if err := queue(b); err != nil {
		return Order{}, err
	}
	if key == "" {
		// Nothing to decide between the inserts and the COMMIT: one trip.
		b.Queue("commit")
		if err := beforeCommit(); err != nil {
			return Order{}, err
		}
		if err := readPlace(conn.SendBatch(ctx, b), key); err != nil {
			// A failed insert made Postgres skip the rest of the pipeline,
			// COMMIT included: the transaction is open, and failed.
			rollback(conn)
			return Order{}, err
		}
		return o, nil
	}
	if err := readPlace(conn.SendBatch(ctx, b), key); err != nil {
		rollback(conn)
		return Order{}, err
	}
	if err := beforeCommit(); err != nil {
		rollback(conn)
		return Order{}, err
	}
	if _, err := conn.Exec(ctx, "commit"); err != nil {
		return Order{}, txErrors.Translate("committing order", err)
	}
	return o, nil
}

// readPlace reads PlaceInPipeline's results in the order it queued them:
// BEGIN, the order, the key when there is one, then the event's statements
// (and the COMMIT, without a key).
func readPlace(br pgx.BatchResults, key string) (err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = txErrors.Translate("orders transaction", cerr)
		}
	}()
	if _, err := br.Exec(); err != nil {
		return txErrors.Translate("beginning order", err)
	}
	if _, err := br.Exec(); err != nil {
		return storeErrors.Translate("inserting order", err)
	}
	if key != "" {
		tag, err := br.Exec()
		if err != nil {
			return storeErrors.Translate("recording idempotency key", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("recording idempotency key %q: %w", key, ErrDuplicate)
		}
	}
	return nil // Close reads the rest: an error of the event's insert
}

// rollback ends a pipelined transaction that will not commit, if it is
// still open. A connection it cannot roll back is closed, which rolls back
// too, and the pool drops it.
func rollback(conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "rollback"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}

// InsertOrder writes a new order in tx.
func (s *Store) InsertOrder(ctx context.Context, tx pgx.Tx, o Order) error {
	_, err := tx.Exec(ctx, sqlInsertOrder,
		o.ID, o.CustomerID, o.AmountCents, o.Currency, o.Status, o.Version, o.CreatedAt, o.UpdatedAt)
	return storeErrors.Translate("inserting order", err)
}

// InsertIdempotencyKey records that key (a request with hash) placed
// orderID, in tx. ErrDuplicate: the key is already recorded (the caller
// rolls tx back and replays). ON CONFLICT DO NOTHING rather than a unique
// violation: a replayed key is the normal path of a retried request, and
// should not write an ERROR line to the server's log each time.
func (s *Store) InsertIdempotencyKey(ctx context.Context, tx pgx.Tx, key string, hash []byte, orderID uuid.UUID) error {
	tag, err := tx.Exec(ctx, sqlInsertIdempotencyKey, key, hash, orderID)
	if err != nil {
		return storeErrors.Translate("recording idempotency key", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("recording idempotency key %q: %w", key, ErrDuplicate)
	}
	return nil
}

// IdempotencyKey returns the request hash and the order recorded for key,
// or ErrNotFound.
func (s *Store) IdempotencyKey(ctx context.Context, key string) (hash []byte, orderID uuid.UUID, err error) {
	err = s.pool.QueryRow(ctx, sqlSelectIdempotencyKey, key).Scan(&hash, &orderID)
	return hash, orderID, storeErrors.Translate("reading idempotency key", err)
}

// Order returns one order, or ErrNotFound.
func (s *Store) Order(ctx context.Context, id uuid.UUID) (Order, error) {
	return s.order(ctx, s.pool, sqlSelectOrder, id)
}

// LockOrder returns one order, locked in tx until it ends, or ErrNotFound.
func (s *Store) LockOrder(ctx context.Context, tx pgx.Tx, id uuid.UUID) (Order, error) {
	return s.order(ctx, tx, sqlSelectOrderForUpdate, id)
}

func (s *Store) order(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, query string, id uuid.UUID) (Order, error) {
	rows, err := db.Query(ctx, query, id)
	if err != nil {
		return Order{}, storeErrors.Translate("reading order", err)
	}
	o, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Order])
	return o, storeErrors.Translate("reading order", err)
}

// UpdateOrder writes o's status, version and update time in tx.
// ErrNotFound: no order has o's id.
func (s *Store) UpdateOrder(ctx context.Context, tx pgx.Tx, o Order) error {
	tag, err := tx.Exec(ctx, sqlUpdateOrder, o.ID, o.Status, o.Version, o.UpdatedAt)
	if err == nil && tag.RowsAffected() == 0 {
		err = pgx.ErrNoRows
	}
	return storeErrors.Translate("updating order", err)
}
