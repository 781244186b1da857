package cdc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
)

// errGapMarkedAgain: the slot was lost and marked again while its gap was
// replayed; the next connection replays the new gap.
var errGapMarkedAgain = errors.New("the replication slot was replaced while its gap was republished")

// replayGap republishes, once the stream holds the slot and before it
// publishes the slot's first event, the lost slot's gap: the rows still
// pending that no slot confirmed (gapRows leaves out what lifecycle.PublishedCDC says
// the old slot published). A new slot streams from its creation only, so
// the rows of a lost slot's window would otherwise never be published, and
// the new slot's first acknowledgement would let retention delete them.
// Rows are read in id order, which is each aggregate's order, and go out
// before any event of the stream, so each aggregate stays in order. A row
// the old slot published but whose confirmation its record had not caught
// (an asynchronous failover can leave the record older than the old
// primary's last one) goes out again; consumers dedupe it by event id: the
// replay may be larger than the gap, never short. The pages are read in
// one snapshot, taken once the stream holds the slot: rows committed after
// the slot's creation and before that snapshot are both here and in the
// stream (published twice, in order both times), and what the snapshot
// does not see the stream delivers.
//
// Only the slot's holder replays, and it replays whatever mark it finds:
// the relay that created the slot may be frozen or dead, and the gap is
// the slot's, not its creator's. The stream waits meanwhile, unread; the
// status updates go on, so the walsender does not time out.
//
// In WAL-only mode the table is empty and this finds nothing: the window's
// events were in the WAL alone (ensureSlot reported them lost).
func (s *streamer) replayGap(ctx context.Context, pending bool, mark time.Time) error {
	r := s.r
	if !pending {
		return nil
	}
	// Taken before the first page: every transaction of this database
	// older than it had ended, so its rows are read by one page or another.
	var xmin string
	if err := r.pool.QueryRow(ctx, horizonXid).Scan(&xmin); err != nil {
		return fmt.Errorf("reading the replay's snapshot: %w", err)
	}
	// Every page from one snapshot: a page is read while transactions
	// commit, and ids are drawn at INSERT, not at commit, so a page read
	// on its own may pass the id of a transaction still open whose
	// aggregate's next version, committed after it with a higher id, a
	// later page finds. That version would go out here and its predecessor
	// only with the stream, after it. In one snapshot an aggregate's rows
	// are there together or not at all (its versions commit one after
	// another), and what the snapshot does not see the stream delivers.
	snap, err := r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("reading the gap's rows: %w", err)
	}
	defer snap.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	var after, total int64
	started := time.Now()
	for {
		evs, err := r.readGapPage(ctx, snap, after)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			break
		}
		// Rows read from the table are as visible as a stream's commits
		// before the standbys have them: the same wait (internal/standby).
		if err := r.standby.Await(ctx, r.pool); err != nil {
			return fmt.Errorf("waiting for the standbys: %w", err)
		}
		// One page at a time: memory stays bounded however long the gap.
		tx := s.begin()
		for _, ev := range evs {
			ev.tx = tx
			if err := s.add(ctx, ev); err != nil {
				return err
			}
		}
		s.seal(tx, 0) // no commit position: the rows are older than the slot
		if err := s.waitAcked(ctx, tx); err != nil {
			return err
		}
		after = evs[len(evs)-1].rowID
		total += int64(len(evs))
		r.cfg.Metrics.CDC.GapRepublished.Add(float64(len(evs)))
	}
	tag, err := r.pool.Exec(ctx, gapReplayed, r.cfg.Slot, after, mark, xmin)
	if err != nil {
		return fmt.Errorf("recording the replayed gap: %w", err)
	}
	if tag.RowsAffected() == 0 {
		set(r.cfg.Metrics).Refuse(ctx, r.cfg.Logger, lifecycle.TransitionGapReplayed, "the slot was marked again (a newer generation) while its gap was replayed",
			slog.String("slot", r.cfg.Slot))
		return errGapMarkedAgain
	}
	if total > 0 {
		r.cfg.Logger.WarnContext(ctx, "republished the outbox rows a new replication slot does not stream, from the table",
			slog.String("slot", r.cfg.Slot), slog.Int64("rows", total), slog.Int64("up_to_outbox_id", after),
			slog.Duration("took", time.Since(started).Round(time.Millisecond)))
	}
	return nil
}

// waitAcked waits until every event of tx is acknowledged, answering the
// server with status updates meanwhile.
func (s *streamer) waitAcked(ctx context.Context, tx *txn) error {
	for tx.pending > 0 {
		if _, err := s.wait(ctx, nil, cdcEvent{}); err != nil {
			return err
		}
	}
	return nil
}

// readGapPage reads up to MaxInFlight pending rows after id after, in the
// replay's snapshot.
func (r *Relay) readGapPage(ctx context.Context, snap pgx.Tx, after int64) ([]cdcEvent, error) {
	rows, err := snap.Query(ctx, gapRows, after, r.cfg.MaxInFlight)
	if err != nil {
		return nil, fmt.Errorf("reading the gap's rows: %w", err)
	}
	defer rows.Close()
	var evs []cdcEvent
	for rows.Next() {
		var (
			id        int64
			ev        event.Envelope
			payload   []byte
			headers   []byte
			createdAt time.Time
		)
		if err := rows.Scan(&id, &ev.EventID, &ev.AggregateType, &ev.AggregateID, &ev.AggregateVersion, &ev.EventType,
			&ev.EventVersion, &payload, &headers, &ev.OccurredAt, &createdAt); err != nil {
			return nil, fmt.Errorf("reading a gap row: %w", err)
		}
		var h publish.Headers
		if err := json.Unmarshal(headers, &h); err != nil {
			return nil, fmt.Errorf("outbox row %d: headers: %w", id, err)
		}
		ev.Payload = payload
		ev.CorrelationID, ev.CausationID, ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		evs = append(evs, r.newEvent(ev, createdAt, id))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the gap's rows: %w", err)
	}
	return evs, nil
}
