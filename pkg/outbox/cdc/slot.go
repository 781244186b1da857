package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/internal/faultpoint"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// Publication is the publication migration 0005 creates on outbox_events
// inserts; Relay streams it.
const Publication = "outbox_events_pub"

// LostSlot describes a replication slot the relay found dropped or
// invalidated and replaced. Events committed between LastConfirmedAt and
// CreatedAt (LastConfirmedLSN and the new slot's position) were in no
// slot's stream: in table mode (outbox.ModeCDC) the relay republishes them from
// the table before it streams; in WAL-only mode (outbox.ModeWAL) they are lost.
type LostSlot struct {
	Slot string
	// Invalidated is true when the slot existed with wal_status 'lost'
	// (max_slot_wal_keep_size exceeded), false when it was missing.
	Invalidated bool
	// LastConfirmedAt is when the lost slot last confirmed a position.
	LastConfirmedAt time.Time
	// LastConfirmedLSN is that position.
	LastConfirmedLSN string
	// CreatedAt is when the new slot was created; it streams from there.
	CreatedAt time.Time
}

// errSlotBusy: another relay streams from the slot (SQLSTATE 55006).
var errSlotBusy = errors.New("the replication slot is active in another relay")

// ensurePublication creates the publication over the replication
// connection if migration 0005 could not (its role had no CREATE on the
// database); a walsender in database mode runs plain SQL too.
func (r *Relay) ensurePublication(ctx context.Context, conn *pgconn.PgConn) error {
	var exists bool
	if err := r.pool.QueryRow(ctx, publicationExists, Publication).Scan(&exists); err != nil {
		return fmt.Errorf("looking for the publication: %w", err)
	}
	if exists {
		return nil
	}
	_, err := conn.Exec(ctx, createPublication).ReadAll()
	if isDuplicateObject(err) {
		return nil // another relay just created it
	}
	if err != nil {
		return fmt.Errorf("creating publication %s (migration 0005 could not: grant CREATE on the database to the migrating role, "+
			"or let REPLICATION_DATABASE_URL's role own outbox_events or be a superuser): %w", Publication, err)
	}
	r.cfg.Logger.InfoContext(ctx, "created the publication the migration could not", slog.String("publication", Publication))
	return nil
}

// connectToSlot opens a walsender connection and makes sure the
// publication and the slot exist on it; the caller closes it.
func (r *Relay) connectToSlot(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, r.replConf)
	if err != nil {
		return nil, fmt.Errorf("connecting for replication: %w", err)
	}
	if err := r.ensurePublication(ctx, conn); err != nil {
		conn.Close(context.Background()) //nolint:errcheck // the error that matters is err
		return nil, err
	}
	if err := r.ensureSlot(ctx, conn); err != nil {
		conn.Close(context.Background()) //nolint:errcheck // the error that matters is err
		return nil, err
	}
	return conn, nil
}

// ensureSlot makes sure the slot exists and is usable, creating it on the
// first start and replacing it, loudly, when it was lost.
func (r *Relay) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	var (
		walStatus, lastLSN *string
		creating           *bool
		lastAt             *time.Time
	)
	if err := r.pool.QueryRow(ctx, slotState, r.cfg.Slot).Scan(&walStatus, &creating, &lastLSN, &lastAt); err != nil {
		return fmt.Errorf("reading the slot's state: %w", err)
	}
	if creating != nil && *creating {
		// Another instance is creating it and it is not consistent yet.
		return fmt.Errorf("the replication slot is being created by another instance: %w", errSlotBusy)
	}
	if walStatus != nil && *walStatus != "lost" {
		if err := r.ensureFailover(ctx, conn); err != nil {
			return err
		}
		if lastLSN == nil {
			// A slot made by hand: record it, so that losing it later is
			// noticed.
			if _, err := r.pool.Exec(ctx, recordHandMadeSlot, r.cfg.Slot); err != nil {
				return fmt.Errorf("recording the slot: %w", err)
			}
		}
		return nil
	}
	invalidated := walStatus != nil
	// Before the slot exists: whoever streams it first republishes the gap.
	if _, err := r.pool.Exec(ctx, markGap, r.cfg.Slot); err != nil {
		return fmt.Errorf("marking the new slot's gap: %w", err)
	}
	if invalidated {
		if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return slotErr("dropping the invalidated slot", err)
		}
	}
	res, err := r.createSlot(ctx, conn)
	if err != nil {
		return slotErr("creating the replication slot", err)
	}
	if err := faultpoint.Pass(ctx, faultpoint.OutboxAfterSlotCreated); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, recordSlot, r.cfg.Slot, res.ConsistentPoint); err != nil {
		return fmt.Errorf("recording the new slot's position: %w", err)
	}
	if lastLSN == nil {
		r.cfg.Logger.InfoContext(ctx, "created the replication slot", slog.String("slot", r.cfg.Slot),
			slog.String("lsn", res.ConsistentPoint))
		return nil
	}
	lost := LostSlot{Slot: r.cfg.Slot, Invalidated: invalidated, LastConfirmedLSN: *lastLSN, CreatedAt: time.Now()}
	if lastAt != nil {
		lost.LastConfirmedAt = *lastAt
	}
	r.cfg.Metrics.SlotLost.Inc()
	attrs := []any{slog.String("slot", r.cfg.Slot), slog.Bool("invalidated", invalidated),
		slog.Time("window_from", lost.LastConfirmedAt), slog.Time("window_to", lost.CreatedAt),
		slog.String("last_confirmed_lsn", lost.LastConfirmedLSN), slog.String("new_slot_lsn", res.ConsistentPoint),
		slog.String("mode", string(r.cfg.Mode))}
	if r.cfg.Mode == outbox.ModeWAL {
		// The price of writing no row: nothing but the WAL held these
		// events, and no slot decoded that range.
		r.cfg.Metrics.CDC.LostUnrecoverable.Inc()
		r.cfg.Logger.ErrorContext(ctx, "REPLICATION SLOT LOST, WAL-ONLY EVENTS LOST: replaced it with a new one; every event Emit wrote "+
			"between last_confirmed_lsn and new_slot_lsn that Kafka had not acknowledged is lost and cannot be republished: "+
			"reconcile from the domain tables (see the runbook)", attrs...)
	} else {
		r.cfg.Logger.ErrorContext(ctx, "REPLICATION SLOT LOST: replaced it with a new one; republishing the window's events from the "+
			"outbox table before streaming (retention waits until that is done)", attrs...)
	}
	if r.cfg.OnSlotLost != nil {
		r.cfg.OnSlotLost(lost)
	}
	return nil
}

// slotErr turns "the slot is active elsewhere" (55006) and "someone else
// just created it" (42710) into errSlotBusy, which a standby retries
// quietly.
func slotErr(what string, err error) error {
	if isObjectInUse(err) || isDuplicateObject(err) {
		return fmt.Errorf("%s: %w (%w)", what, errSlotBusy, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
