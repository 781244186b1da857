package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/platform/pgutil"
)

// The store's named errors: Run's callers match these with errors.Is and
// never see pgx's errors or a SQLSTATE; the driver's error stays in the
// chain behind the name.
var (
	// ErrNotMigrated: a table the check reads does not exist (SQLSTATE
	// 42P01). Never "nothing found": a URL pointing at the wrong database
	// would report a clean platform.
	ErrNotMigrated = errors.New("a table is missing (is the service's database migrated, and is the URL the right database?)")
	// ErrUnavailable: a database cannot be reached or cannot serve now
	// (pgutil.IsUnavailable); the next run tries again.
	ErrUnavailable = errors.New("a database is unavailable")
)

var storeErrors = pgutil.StoreErrors{Unavailable: ErrUnavailable}

// undefinedTable is SQLSTATE 42P01.
const undefinedTable = "42P01"

// translate names err, from the read described by op.
func translate(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		return fmt.Errorf("%s: %w: %w", op, ErrNotMigrated, err)
	}
	return storeErrors.Translate(op, err)
}

// The reads. Every statement is a SELECT, run as the read-only role
// reconcile_ro (see package pgroles): the tool never writes.
//
// The backlog checks read the outbox's and the inbox's tables
// (outbox_events, inbox_messages) directly, as their only reader outside
// pkg/outbox and pkg/inbox: neither library exports a read of "rows in state
// S older than T" yet. When they do, these constants give way to calls.
// Each where clause takes the threshold as $1, in microseconds.
const (
	outboxTable = "outbox_events"
	inboxTable  = "inbox_messages"

	whereOutboxStuck    = "state = 'pending' AND created_at < now() - $1::bigint * interval '1 microsecond'"
	whereOutboxDead     = "state = 'dead' AND $1::bigint >= 0"
	whereInboxLeaseOver = "status = 'leased' AND lease_until < now() - $1::bigint * interval '1 microsecond'"
	whereInboxUncertain = "status = 'uncertain' AND $1::bigint >= 0"
	whereDeadLetterLate = "status = 'dead_lettered' AND received_at < now() - $1::bigint * interval '1 microsecond'"
	sqlOrdersInWindow   = `
		SELECT id::text, created_at FROM orders WHERE created_at < now() - $1::bigint * interval '1 microsecond'
		   AND created_at > now() - $2::bigint * interval '1 microsecond' ORDER BY created_at`
	sqlChargesOfOrders = `SELECT order_id::text FROM charges WHERE order_id = ANY($1::uuid[])`
	sqlChargesInWindow = `
		SELECT order_id::text, captured_at FROM charges WHERE captured_at < now() - $1::bigint * interval '1 microsecond'
		   AND captured_at > now() - $2::bigint * interval '1 microsecond' ORDER BY captured_at`
	sqlCaptureForwardsOfOrders = `SELECT order_id::text FROM forwards WHERE kind = 'capture' AND order_id = ANY($1::uuid[])`
)

// Querier is what Run needs of a database: a *pgxpool.Pool or a *pgx.Conn.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// check is a finding read from one table of one database.
type check struct {
	kind, table, where, ts, id string
	threshold                  time.Duration
}

func (c check) run(ctx context.Context, db Querier, service string, samples int) (Finding, error) {
	f := Finding{Kind: c.kind, Component: service}
	var oldest *time.Time
	op := "counting " + c.table
	err := db.QueryRow(ctx, "SELECT count(*), min("+c.ts+") FROM "+c.table+" WHERE "+c.where, c.threshold.Microseconds()).
		Scan(&f.Count, &oldest)
	if err != nil {
		return f, translate(op, err)
	}
	if f.Count == 0 {
		return f, nil
	}
	f.Oldest = *oldest
	op = "sampling " + c.table
	rows, err := db.Query(ctx, "SELECT "+c.id+"::text FROM "+c.table+" WHERE "+c.where+" ORDER BY "+c.ts+" LIMIT $2",
		c.threshold.Microseconds(), samples)
	if err != nil {
		return f, translate(op, err)
	}
	f.Samples, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return f, translate(op, err)
}

// lookup reports which of ids exist on the other side.
type lookup func(ctx context.Context, ids []string) (map[string]bool, error)

// present is a lookup by a query taking the ids as $1.
func present(db Querier, query string) lookup {
	return func(ctx context.Context, ids []string) (map[string]bool, error) {
		rows, err := db.Query(ctx, query, ids)
		if err != nil {
			return nil, translate("looking ids up", err)
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, translate("looking ids up", err)
		}
		out := make(map[string]bool, len(found))
		for _, id := range found {
			out[id] = true
		}
		return out, nil
	}
}

// idsSince streams the (id, time) rows of query, oldest first, to each.
func idsSince(ctx context.Context, db Querier, query string, args []any, each func(id string, at time.Time) error) error {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return translate("listing ids", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id string
			at time.Time
		)
		if err := rows.Scan(&id, &at); err != nil {
			return translate("listing ids", err)
		}
		if err := each(id, at); err != nil {
			return err
		}
	}
	return translate("listing ids", rows.Err())
}
