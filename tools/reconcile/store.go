package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/pgerr"
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
	// (pgerr.IsUnavailable); the next run tries again.
	ErrUnavailable = errors.New("a database is unavailable")
)

var storeErrors = pgerr.StoreErrors{Unavailable: ErrUnavailable}

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
// The backlog checks read the outbox's and the inbox's tables through
// outboxadmin.Backlog and inboxadmin.Backlog (in Run): this package knows
// neither their tables nor their states. The statements below read the
// services' own tables, whose stores export no such reads. Each takes its
// thresholds in microseconds.
const (
	sqlOrdersInWindow = `
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

// backlogFinding is the Finding of one state of a library's backlog.
func backlogFinding(kind, component string, count int, oldest time.Time, samples []uuid.UUID) Finding {
	f := Finding{Kind: kind, Component: component, Count: count, Oldest: oldest}
	for _, id := range samples {
		f.Samples = append(f.Samples, id.String())
	}
	return f
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
