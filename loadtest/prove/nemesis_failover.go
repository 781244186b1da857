package prove

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The failover fault: billing's database fails over in the middle of a
// migration and a scale-up of billing. Each part is an everyday
// event; together, and in this order, they reach what random combinations
// of the other kinds almost never do: a consumer generation dropped while
// its worker holds a batch that has several messages of one key, then that
// batch failing, and the database taking connections again a moment later.
// That is when a worker abandons a message (issue 19 item 4): it must
// abandon the later messages of the key in its batch with it, or they are
// applied ahead of it, and it comes back to find its successor applied
// (stale, or parked behind the successor's dead letter).
//
//  1. A migration locks billing's charges table (LOCK ... IN EXCLUSIVE
//     MODE, as an ALTER TABLE does) for Hold: billing's writes wait, and
//     its workers' queues fill, with an order's OrderPlaced and its
//     OrderCancelled side by side.
//  2. Its next statement locks the table again at once: the batches the
//     workers took from the full queues wait behind it.
//  3. One more billing instance starts (a scale-up) and joins the group:
//     the members' generations end and, their batches held by the lock, are
//     dropped undrained RebalanceTimeout/2 later.
//  4. The failover: connections to billing's database are refused, every
//     session on it is cut (the migration's too, so the lock goes), and
//     connections are taken again N ms later.
//
// The instance that joined leaves again afterwards. The second lock is
// queued before the first is released: asked for after, it would race
// the batches the release lets go.

// failoverDropWait is how long step 3 waits after the instance started
// before the failover: a heartbeat (1 s) for the members to see the
// rebalance, RebalanceTimeout/2 (5 s) for them to give their generations
// up, and a margin.
const failoverDropWait = 8 * time.Second

// failover runs the failover fault (see above).
func (n *nemesisRun) failover(ctx context.Context, s step) (string, error) {
	db := n.p.BillingDB
	cctx := context.WithoutCancel(ctx)
	admin := n.h.stack.Admin
	// Two sessions, as a migration tool's: the second lock is asked for
	// while the first is still held, so that it waits in the lock's queue
	// ahead of every batch that comes after the first one's release.
	var conns [2]*pgx.Conn
	for i := range conns {
		c, err := pgx.Connect(ctx, n.h.stack.PGURL(db, false))
		if err != nil {
			return "", err
		}
		defer c.Close(cctx)
		conns[i] = c
	}
	const lockCharges = "LOCK TABLE charges IN EXCLUSIVE MODE"
	first, err := conns[0].Begin(ctx)
	if err != nil {
		return "", err
	}
	defer first.Rollback(cctx) //nolint:errcheck // committed below, or given up
	if _, err := first.Exec(ctx, lockCharges); err != nil {
		return "locking charges failed", err
	}
	hold(ctx, s.Hold)
	second, err := conns[1].Begin(ctx)
	if err != nil {
		return "", err
	}
	defer second.Rollback(cctx) //nolint:errcheck // the failover cut it already, or it ends here
	locked := make(chan error, 1)
	go func() { _, err := second.Exec(ctx, lockCharges); locked <- err }()
	// Released only once the second lock waits in the queue.
	_ = waitUntil(ctx, 5*time.Second, func() bool {
		var waiting bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, conns[1].PgConn().PID()).Scan(&waiting)
		return err == nil && waiting
	})
	if err := first.Commit(ctx); err != nil {
		return "", err
	}
	if err := <-locked; err != nil {
		return "locking charges again failed", err
	}
	conn, tx := conns[1], second
	// A scale-up: one more billing instance joins the group.
	n.procMu.Lock()
	pr, err := n.p.newInstance[KindBilling]()
	n.procMu.Unlock()
	if err != nil {
		return "no instance to join", err
	}
	if err := startPatiently(ctx, pr, true); err != nil {
		return pr.Name + " could not join", err
	}
	defer pr.Stop() // it leaves again once the failover is over
	joined := pr.Name + " joined"
	hold(ctx, failoverDropWait)

	// Whatever happens from here, billing's database takes connections
	// again before this returns.
	if _, err := admin.Exec(cctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" CONNECTION LIMIT 0"); err != nil {
		return joined, fmt.Errorf("refusing connections to %s: %w", db, err)
	}
	defer func() { _ = n.allowBillingConnections(cctx) }()
	var cut, waiting int
	err = admin.QueryRow(cctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)), count(*) FILTER (WHERE wait_event_type = 'Lock')
		FROM pg_stat_activity WHERE datname = $1 AND pid <> $2 AND usename <> current_user`, db, conn.PgConn().PID()).Scan(&cut, &waiting)
	if err != nil {
		return joined, fmt.Errorf("cutting the sessions of %s: %w", db, err)
	}
	// The lock goes with the sessions: one that was cut while it waited
	// and is given the lock before it is gone dies before it can commit.
	_ = tx.Rollback(cctx)
	refused := time.Duration(s.N) * time.Millisecond
	hold(ctx, refused)
	if err := n.allowBillingConnections(cctx); err != nil {
		return joined, err
	}
	return fmt.Sprintf("charges locked %.1fs, then again while %s; %d billing sessions cut (%d waiting on the lock) and connections refused for %s, then %s left",
		s.Hold.Seconds(), joined, cut, waiting, refused, pr.Name), nil
}

// failoverRestoreFor bounds how long billing's database is told to take
// connections again: another step may have PostgreSQL stopped meanwhile.
const failoverRestoreFor = 3 * time.Minute

// allowBillingConnections lifts the failover's connection limit on
// billing's database, retrying while PostgreSQL does not answer.
func (n *nemesisRun) allowBillingConnections(ctx context.Context) error {
	stmt := "ALTER DATABASE " + pgx.Identifier{n.p.BillingDB}.Sanitize() + " CONNECTION LIMIT -1"
	deadline := time.Now().Add(failoverRestoreFor)
	for {
		_, err := n.h.stack.Admin.Exec(ctx, stmt)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("taking connections to %s again: %w", n.p.BillingDB, err)
		}
		hold(ctx, time.Second)
	}
}
