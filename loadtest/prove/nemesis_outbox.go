package prove

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The outbox's lifecycle faults (issue 30), opt-in: they run only when
// NEMESIS= names them, so the default schedule of every seed stays what
// it was.
const (
	// NemLongTx holds a transaction id open for a while, in orders'
	// database: a logical slot created meanwhile (in any database of the
	// cluster) is consistent only once it ends, and orders' log-based
	// relay's published horizon (so its retention, and what Backlog calls
	// published), which counts its own database's transactions only, waits
	// for it.
	NemLongTx = "longtx"
	// NemPublication drops a service's outbox publication and creates it
	// again around the load's commits (RELAY_MODE=cdc only): a change
	// committed while it was missing stalls every stream there, and the
	// nemesis then takes the runbook's step (docs/runbook-cdc.md, "A
	// publication dropped and recreated"): it drops the slot, and the relay
	// republishes the window from the table.
	NemPublication = "publication"
	// NemWALStart starts every billing instance together on a slot that
	// does not exist yet, as a WAL-only service's first deploy does
	// (RELAY_MODE=wal only; nemesis_walstart.go): one creates the slot,
	// the others find it being created, and a transaction held open meanwhile
	// keeps it from being consistent for a while. An instance that emitted
	// before the slot was consistent would lose those events silently.
	NemWALStart = "walstart"
)

// NemesisOptInKinds are the fault kinds that run only when named.
var NemesisOptInKinds = []string{NemLongTx, NemPublication, NemWALStart, NemDLT, NemBookReject, NemHeld, NemSecondGroup}

// optInKinds returns the opt-in kinds sel names that relayMode can run.
func optInKinds(sel []string, relayMode string) []string {
	var out []string
	for _, k := range NemesisOptInKinds {
		named := slices.ContainsFunc(sel, func(s string) bool { return strings.TrimSpace(s) == k })
		if !named || (k == NemPublication && relayMode != "cdc") || (k == NemWALStart && relayMode != "wal") {
			continue
		}
		out = append(out, k)
	}
	return out
}

// planOptIn fills in a step of an opt-in kind.
func planOptIn(s *step, dur func(lo, hi time.Duration) time.Duration, pick func([]string) string) {
	switch s.Kind {
	case NemLongTx:
		s.Target, s.Hold = "postgres", dur(5*time.Second, 40*time.Second)
	case NemPublication:
		s.Target, s.Hold = pick([]string{"orders", "billing"}), dur(time.Second, 5*time.Second)
	case NemDLT:
		planDLT(s, dur, pick) // nemesis_dlt.go
	case NemWALStart:
		s.Target, s.Hold = KindBilling, dur(2*time.Second, 10*time.Second)
	case NemBookReject, NemHeld, NemSecondGroup:
		planInbox(s, dur, pick) // nemesis_inbox.go
	}
}

// runOptIn performs a step of an opt-in kind; ok is false for any other.
func (n *nemesisRun) runOptIn(ctx context.Context, s step) (detail string, ok bool, err error) {
	switch s.Kind {
	case NemLongTx:
		detail, err = n.longTx(ctx, s.Hold)
		return detail, true, err
	case NemPublication:
		detail, err = n.publication(ctx, s.Target, s.Hold)
		return detail, true, err
	case NemDLT:
		detail, err = n.runDLT(ctx, s)
		return detail, true, err
	case NemWALStart:
		detail, err = n.walStart(ctx, s.Hold)
		return detail, true, err
	case NemBookReject, NemHeld, NemSecondGroup:
		detail, err = n.runInbox(ctx, s)
		return detail, true, err
	}
	return "", false, nil
}

// longTx holds a transaction id for d, in orders' database.
func (n *nemesisRun) longTx(ctx context.Context, d time.Duration) (string, error) {
	tx, err := n.p.ordersPool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // committed below
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return "", err
	}
	hold(ctx, d)
	return fmt.Sprintf("transaction %s open in orders' database for %.1fs", xid, d.Seconds()), tx.Commit(context.WithoutCancel(ctx))
}

// publication drops service's publication for d while the load commits,
// creates it again, and, if the slot then cannot move past the position of
// the re-creation within nemPublicationStall (a change committed meanwhile
// stalls it), takes the runbook's step: the slot dropped.
func (n *nemesisRun) publication(ctx context.Context, service string, d time.Duration) (string, error) {
	pool, db := n.p.ordersPool, n.p.OrdersDB
	if service == "billing" {
		pool, db = n.p.billingPool, n.p.BillingDB
	}
	const create = `CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert')`
	if _, err := pool.Exec(ctx, `DROP PUBLICATION IF EXISTS outbox_events_pub`); err != nil {
		return "", err
	}
	hold(ctx, d)
	cctx := context.WithoutCancel(ctx)
	if _, err := pool.Exec(cctx, create); err != nil && !strings.Contains(err.Error(), "42710") {
		return "not created again", err // 42710: the relay made it again on a reconnect
	}
	var after string
	if err := pool.QueryRow(cctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after); err != nil {
		return "", err
	}
	if slotPasses(cctx, n.h.stack.Admin, db, after, nemPublicationStall) {
		return fmt.Sprintf("publication dropped for %.1fs, created again; the stream went on", d.Seconds()), nil
	}
	dropped, err := n.dropSlot(cctx, service)
	return fmt.Sprintf("publication dropped for %.1fs, created again; the stream stalled, runbook: %s", d.Seconds(), dropped), err
}

// nemPublicationStall is how long a stream may take to pass the position
// of a publication's re-creation before the nemesis calls it stalled.
const nemPublicationStall = 20 * time.Second

// slotPasses waits up to within for slot's confirmed position to reach lsn.
func slotPasses(ctx context.Context, admin *pgxpool.Pool, slot, lsn string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var passed bool
		err := admin.QueryRow(ctx, `SELECT coalesce(bool_or(confirmed_flush_lsn >= $2::pg_lsn), false)
			FROM pg_replication_slots WHERE slot_name = $1`, slot, lsn).Scan(&passed)
		if err == nil && passed {
			return true
		}
		hold(ctx, 200*time.Millisecond)
	}
	return false
}
