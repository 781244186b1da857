package cdc

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/wal"
)

// What a Postgres failover asks of the log-based relay (issue 32).
//
// A logical slot lives on one server. Before PostgreSQL 17 a promoted
// standby has none: the relay makes a new one, and what was committed
// between the old slot's last confirmed position and the new slot's
// creation is in no stream (table mode republishes it from outbox_events;
// WAL-only mode has nothing to republish it from). From 17 on, a slot
// created with FAILOVER is copied to a standby that runs with
// sync_replication_slots = on, and the primary's synchronized_standby_slots
// keeps the relay from decoding what that standby has not received: after
// a promotion the relay streams on from the synchronized slot, with no gap.
//
// WAL-only mode must also take no write while no slot exists on the server
// it writes to: such an event is kept by nothing. Emit refuses then
// (ErrNoSlot, an outage to wait out), and Relay.SlotReady tells /readyz.

// SlotReady reports, for /readyz, whether the server the relay's pool
// reaches now (the primary, through a multi-host URL with
// target_session_attrs=read-write) holds a slot that keeps what Emit
// writes. In outbox.ModeCDC it is always nil: the table keeps every event. In
// ModeWAL a service is not ready until it is, and Emit refuses meanwhile.
func (r *Relay) SlotReady(ctx context.Context) error {
	if r.cfg.Mode != outbox.ModeWAL {
		return nil
	}
	return wal.CheckSlotHeld(ctx, r.pool, "WAL-only mode")
}

// serverMajor is the major version of the server conn is on (0 if unknown).
func serverMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version")
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimSpace(v), ".", 2)[0])
	return major
}

// createSlot creates the relay's slot over the walsender connection conn:
// on PostgreSQL 17 and later with FAILOVER, so that a standby with
// sync_replication_slots = on keeps a copy the relay resumes from after a
// promotion; before 17 as an ordinary slot.
func (r *Relay) createSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.CreateReplicationSlotResult, error) {
	if serverMajor(conn) < 17 {
		return pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.Slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	}
	// The option list form (PostgreSQL 15+), which FAILOVER needs; the slot
	// name passed Validate's [a-z0-9_] check, so it needs no quoting.
	return pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
		"CREATE_REPLICATION_SLOT "+r.cfg.Slot+" LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"))
}

// ensureFailover turns FAILOVER on for an existing slot on PostgreSQL 17
// and later that was created without it (by an older relay, or by hand),
// so that it is synchronized to the standby from now on.
func (r *Relay) ensureFailover(ctx context.Context, conn *pgconn.PgConn) error {
	if serverMajor(conn) < 17 {
		return nil
	}
	var failover bool
	err := r.pool.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`,
		r.cfg.Slot).Scan(&failover)
	if err != nil || failover {
		return nil // gone meanwhile, or unreadable: the stream's own errors say what matters
	}
	if _, err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+r.cfg.Slot+" (FAILOVER true)").ReadAll(); err != nil {
		if isObjectInUse(err) {
			return nil // another relay streams it; it will alter it
		}
		return slotErr("turning FAILOVER on for the replication slot", err)
	}
	r.cfg.Logger.InfoContext(ctx, "turned FAILOVER on for the replication slot: a standby with sync_replication_slots keeps a copy",
		slog.String("slot", r.cfg.Slot))
	return nil
}
