package cdc

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/metrics"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
	"github.com/onceflow/onceflow/pkg/outbox/internal/standby"
	"github.com/onceflow/onceflow/pkg/outbox/internal/wal"
)

// cdcEvent is one event decoded from the stream (or, after a lost slot,
// read from the table).
type cdcEvent struct {
	publish.Claimed
	rowID   int64 // outbox_events id; 0 for an emitted event
	version int64 // aggregate version, which orders the holds (lane.deadAhead)
	tx      *txn  // the transaction it belongs to, for the slot's confirmation
	// recheck: the row may have been published, and then settled (marked
	// dead, requeued), before this stream, which delivers again what the
	// slot had not confirmed; the lane checks (dropSettled). Rows of
	// transactions that committed after this stream took the slot, most of
	// them, were never delivered to anyone before, and go unchecked.
	recheck bool
}

// txn is a decoded transaction whose events are not all acknowledged yet.
// The slot may be confirmed past a transaction's commit only once every
// event of it, and of every transaction before it, is acknowledged (or
// skipped as dead): the events themselves go to Kafka as soon as they are
// decoded, in chunks, whatever the transaction's size.
type txn struct {
	end     pglogrepl.LSN // commit end; set when the commit is decoded
	recheck bool          // it committed before the stream took the slot (cdcEvent.recheck)
	sealed  bool          // its commit was decoded: no more events will join
	pending int           // events handed to a lane and not yet acknowledged
	maxID   int64         // highest outbox id among its events
	// xid is the transaction's id: the stream delivers a commit once it is
	// flushed, which can be before other sessions see it (Relay.markDead).
	xid  uint32
	elem *list.Element // in streamer.txs
}

// streamer is the state of one replication connection. Only its own
// goroutine uses the connection and the transaction list; the lanes
// publish, one per topic, and report back on acked.
type streamer struct {
	r    *Relay
	conn *pgconn.PgConn

	relations map[uint32]*rowColumns // nil for relations other than outbox_events
	open      *txn
	// fresh is a WAL position read once the stream held the slot: a
	// transaction that commits past it was never delivered before.
	fresh pglogrepl.LSN
	// standbyAt is the standbys' flush position this stream last read
	// (outbox.Standby.PublishReplicated): commits below it need no query.
	standbyAt standby.LSN

	build *msgBuilder
	cols  [][]byte    // the columns of the row being decoded
	raw   rawEnvelope // the event being decoded

	// txs holds, oldest first, the transactions with events not yet
	// acknowledged (and the open one). A transaction whose events are all
	// acknowledged while an older one is not is merged into that older one,
	// so the list never holds more than the events in flight, however long
	// one topic stays down while the others flow.
	txs list.List

	lanes     map[string]*lane
	holds     map[string]map[string]hold // per topic, loaded before the first event (loadHolds)
	acked     chan laneAck
	laneCtx   context.Context //nolint:containedctx // the lanes' lifetime: this connection's
	stopLanes context.CancelFunc
	laneWG    sync.WaitGroup

	// generation is the slot record's created_at when this stream took the
	// slot: it records positions for that slot only (recordConfirmed).
	generation  time.Time
	confirmed   pglogrepl.LSN // acknowledged by Kafka (or holding no events)
	confirmedID int64
	recorded    pglogrepl.LSN // last confirmed position written to outbox_cdc_slots
	recordedID  int64
	nextRecord  time.Time // the earliest time to write it again
	nextStatus  time.Time
	lastStatus  time.Time
}

// confirmEvery is the most often the stream confirms acknowledged events to
// the server while they flow; idle, it reports every StatusInterval.
const confirmEvery = 10 * time.Millisecond

func newStreamer(ctx context.Context, r *Relay, conn *pgconn.PgConn, start pglogrepl.LSN) *streamer {
	s := &streamer{r: r, conn: conn, relations: map[uint32]*rowColumns{}, lanes: map[string]*lane{},
		acked: make(chan laneAck, 16), confirmed: start, recorded: start,
		fresh: pglogrepl.LSN(math.MaxUint64), build: newMsgBuilder(r.cfg.Topic)}
	s.txs.Init()
	s.laneCtx, s.stopLanes = context.WithCancel(ctx)
	return s
}

// close stops the lanes: what they hold and did not report acknowledged is
// not confirmed, so the next stream starts before it. It records the
// confirmed position in outbox_cdc_slots if it moved since the last record.
func (s *streamer) close() {
	s.stopLanes()
	s.laneWG.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), s.r.cfg.StatusInterval)
	defer cancel()
	s.record(ctx)
}

func (r *Relay) streamOnce(ctx context.Context) error {
	conn, err := r.connectToSlot(ctx)
	if err != nil {
		return err
	}
	// Closing without a last status update is what a crash does: the slot
	// keeps the last confirmed position, and the next relay starts there.
	defer conn.Close(context.Background()) //nolint:errcheck // the connection is done either way
	// proto_version 1 suffices: pgoutput sends logical decoding messages
	// with messages 'true' since Postgres 14. With version 1 a transaction
	// is sent only once it committed (decoding waits for the commit record),
	// so its events may be published while the rest of it is still being
	// decoded; the slot is confirmed past it only once all are acknowledged.
	// Position 0 resumes at the slot's confirmed position.
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return slotErr("starting replication", err)
	}
	// The slot is this stream's now (another relay's START_REPLICATION
	// fails with 55006): nobody else moves its position or replays its gap.
	var start pglogrepl.LSN
	var lsnText string
	if err := r.pool.QueryRow(ctx, slotConfirmed, r.cfg.Slot).Scan(&lsnText); err != nil {
		return fmt.Errorf("reading the slot's confirmed position: %w", err)
	}
	if start, err = pglogrepl.ParseLSN(lsnText); err != nil {
		return fmt.Errorf("parsing the slot's confirmed position: %w", err)
	}
	s := newStreamer(ctx, r, conn, start)
	defer s.close()
	// A transaction committed past the server's current position cannot
	// have been delivered to any relay before. Unknown (the read failed):
	// every row is checked.
	var fresh string
	if err := r.pool.QueryRow(ctx, currentWAL).Scan(&fresh); err == nil {
		if lsn, err := pglogrepl.ParseLSN(fresh); err == nil {
			s.fresh = lsn
		}
	}
	// The holds, before anything is delivered: an event decoded before its
	// aggregate's hold was read could be published ahead of it.
	if s.holds, err = r.loadHolds(ctx); err != nil {
		return err
	}
	// Before the slot's first event, and only by the relay that holds the
	// slot: the rows a new slot's stream does not carry go first, so each
	// aggregate stays in order. A relay that replayed before it held the
	// slot could publish the gap after another relay streamed past it.
	var (
		gapPendingNow bool
		generation    time.Time
	)
	if err := r.pool.QueryRow(ctx, gapPending, r.cfg.Slot).Scan(&gapPendingNow, &generation); err != nil && !isNoRows(err) {
		return fmt.Errorf("reading the slot's record: %w", err)
	}
	s.generation = generation
	if err := s.replayGap(ctx, gapPendingNow, generation); err != nil {
		return err
	}
	r.setActive(true)
	r.stream.OK(ctx)
	r.cfg.Logger.InfoContext(ctx, "streaming the outbox from the replication slot", slog.String("slot", r.cfg.Slot),
		slog.String("from_lsn", start.String()))
	if err := s.run(ctx); err != nil {
		return fmt.Errorf("%w: %w", errStreamed, err)
	}
	return nil
}

// laneAck reports events a lane's topic acknowledged (or skipped as dead),
// or why the lane stopped.
type laneAck struct {
	txs []*txn // one per event
	err error
}

// noteAcked counts acknowledged events off their transactions and confirms
// the transactions they complete.
func (s *streamer) noteAcked(a laneAck) error {
	if a.err != nil {
		return a.err
	}
	for _, tx := range a.txs {
		tx.pending--
		if tx.pending == 0 && tx.sealed {
			s.done(tx)
		}
	}
	// Confirm soon, not with every acknowledgement: at a thousand events a
	// second that was a status message (a write on both sides) for every
	// few events.
	if soon := s.lastStatus.Add(confirmEvery); soon.Before(s.nextStatus) {
		s.nextStatus = soon
	}
	return nil
}

// done takes a wholly acknowledged transaction off the list. The oldest one
// moves the confirmed position to its commit; a later one cannot (an older
// one still waits), so it hands its commit to the one before it, which
// confirms both when it is done.
func (s *streamer) done(tx *txn) {
	if prev := tx.elem.Prev(); prev != nil {
		p := prev.Value.(*txn)
		p.end, p.maxID = max(p.end, tx.end), max(p.maxID, tx.maxID)
	} else {
		if tx.end > s.confirmed {
			s.r.progressed()
		}
		s.confirmed = max(s.confirmed, tx.end)
		s.confirmedID = max(s.confirmedID, tx.maxID)
	}
	s.txs.Remove(tx.elem)
}

// handOver passes ev to its lane. While the lane is full (its topic is
// slow or away, or the transaction is big) it waits, still counting
// acknowledgements and answering the server with status updates so the
// walsender does not time out: memory is bounded by the lanes' capacity,
// never by a transaction's size.
func (s *streamer) handOver(ctx context.Context, l *lane, ev cdcEvent) error {
	select {
	case l.in <- ev:
		return nil
	default:
	}
	for {
		if taken, err := s.wait(ctx, l.in, ev); taken || err != nil {
			return err
		}
	}
}

// wait waits for one thing: in taking ev (a nil in never does), an
// acknowledgement, the next status update to send, or ctx's end. It reports
// whether ev was taken.
func (s *streamer) wait(ctx context.Context, in chan<- cdcEvent, ev cdcEvent) (taken bool, err error) {
	timer := time.NewTimer(max(time.Until(s.nextStatus), 0))
	defer timer.Stop()
	select {
	case in <- ev:
		return true, nil
	case a := <-s.acked:
		return false, s.noteAcked(a)
	case <-timer.C:
		return false, s.sendStatus(ctx)
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// add hands one decoded event to its topic's lane, starting the lane on
// the topic's first event.
func (s *streamer) add(ctx context.Context, ev cdcEvent) error {
	l := s.lanes[ev.Msg.Topic]
	if l == nil {
		l = s.r.newLane(ev.Msg.Topic, s.acked, s.holds[ev.Msg.Topic])
		s.lanes[ev.Msg.Topic] = l
		s.laneWG.Go(func() { l.run(s.laneCtx) })
	}
	ev.tx.pending++
	ev.tx.maxID = max(ev.tx.maxID, ev.rowID)
	return s.handOver(ctx, l, ev)
}

// begin opens a transaction on the list.
func (s *streamer) begin() *txn {
	tx := &txn{}
	tx.elem = s.txs.PushBack(tx)
	return tx
}

// seal marks tx complete at end; if every event of it was acknowledged
// already (or it had none), it is done now.
func (s *streamer) seal(tx *txn, end pglogrepl.LSN) {
	tx.end, tx.sealed = end, true
	if tx.pending == 0 {
		s.done(tx)
	}
}

func (s *streamer) run(ctx context.Context) error {
	// The wait for the next message ends at the next status update, by the
	// socket's read deadline rather than a context's: pgconn watches a
	// context with a goroutine of its own for every message, which at a
	// few messages per event cost more than decoding them. ctx's end moves
	// the deadline into the past.
	sock := s.conn.Conn()
	stop := context.AfterFunc(ctx, func() { _ = sock.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	for ctx.Err() == nil {
		for drained := false; !drained; {
			select {
			case a := <-s.acked:
				if err := s.noteAcked(a); err != nil {
					return err
				}
			default:
				drained = true
			}
		}
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
		}
		if err := sock.SetReadDeadline(s.nextStatus); err != nil {
			return fmt.Errorf("receiving: %w", err)
		}
		if ctx.Err() != nil { // ended before the deadline was set: AfterFunc ran already
			return nil
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receiving: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			if m.Code == sqlstateUndefinedObject && strings.Contains(m.Message, "publication") {
				return fmt.Errorf("replication stream: %w: %w", errPublicationMissing, serverError(m))
			}
			return fmt.Errorf("replication stream: %w", serverError(m))
		case *pgproto3.CopyData:
			if err := s.handle(ctx, m.Data); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
	}
	return nil
}

func (s *streamer) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parsing a keepalive: %w", err)
		}
		// Nothing in flight: every change before ServerWALEnd was sent and
		// handled, so the slot may move there (as Postgres's own apply
		// worker does); otherwise an idle outbox in a busy database would
		// pin WAL.
		if s.idle() && k.ServerWALEnd > s.confirmed {
			s.confirmed = k.ServerWALEnd
			s.r.progressed()
		}
		if k.ReplyRequested {
			s.nextStatus = time.Time{}
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parsing XLogData: %w", err)
		}
		return s.decode(ctx, x)
	}
	return nil
}

func (s *streamer) decode(ctx context.Context, x pglogrepl.XLogData) error {
	data := x.WALData
	if len(data) == 0 {
		return nil
	}
	body := data[1:]
	switch data[0] {
	case pgoBegin:
		final, xid, err := beginFinal(body)
		if err != nil {
			return fmt.Errorf("parsing a begin message: %w", err)
		}
		// The walsender decoded this transaction's commit: the primary
		// flushed it. With outbox.Standby.PublishReplicated nothing of it goes to
		// a lane before the standbys flushed it too (internal/standby); a
		// wait that runs out ends the stream, and the next one delivers
		// the transaction again, the slot not having moved past it.
		if err := s.r.standby.AwaitCommit(ctx, s.r.pool, standby.LSN(x.ServerWALEnd), &s.standbyAt); err != nil {
			return fmt.Errorf("waiting for the standbys: %w", err)
		}
		s.open = s.begin()
		s.open.recheck, s.open.xid = final < s.fresh, xid
	case pgoRelation:
		msg, err := pglogrepl.Parse(data)
		if err != nil {
			return fmt.Errorf("parsing a relation message: %w", err)
		}
		if rel, ok := msg.(*pglogrepl.RelationMessage); ok {
			s.relations[rel.RelationID] = newRowColumns(rel)
		}
	case pgoInsert:
		if len(body) < 4 || s.open == nil {
			return nil
		}
		cols := s.relations[binary.BigEndian.Uint32(body)]
		if cols == nil {
			return nil // another table's insert
		}
		var err error
		if _, s.cols, err = parseInsert(body, cols.n, s.cols); err != nil {
			// A row Postgres accepted but the relay cannot read is a bug or
			// a schema the relay does not know; skipping it would lose it.
			return fmt.Errorf("decoding an outbox row: %w", err)
		}
		rowID, createdAt, err := cols.decodeRow(s.cols, &s.raw)
		if err != nil {
			return fmt.Errorf("decoding an outbox row: %w", err)
		}
		ev := cdcEvent{Claimed: s.build.build(&s.raw), rowID: rowID, version: s.raw.aggVersion, tx: s.open, recheck: s.open.recheck}
		ev.ID, ev.CreatedAt = rowID, createdAt
		return s.add(ctx, ev)
	case pgoMessage:
		m, err := parseLogicalMessage(body)
		if err != nil {
			return fmt.Errorf("parsing a logical decoding message: %w", err)
		}
		if string(m.prefix) != wal.Prefix {
			return nil
		}
		if !m.transactional || s.open == nil {
			// Emit writes transactional messages only; anything else under
			// its prefix was written by hand and is not an outbox event.
			s.r.refuseEmitted(ctx, metrics.RefusedNonTransactional, errors.New("not transactional"), m.lsn, m.content)
			return nil
		}
		emittedAt, reason, err := decodeEmitted(m.content, &s.raw)
		if err != nil {
			// Never a stall: the stream goes on past a message it refuses.
			s.r.refuseEmitted(ctx, reason, err, m.lsn, m.content)
			return nil
		}
		ev := cdcEvent{Claimed: s.build.build(&s.raw), tx: s.open}
		ev.CreatedAt = emittedAt
		return s.add(ctx, ev)
	case pgoCommit:
		end, err := commitEnd(body)
		if err != nil {
			return fmt.Errorf("parsing a commit message: %w", err)
		}
		if s.open != nil {
			s.seal(s.open, end)
			s.open = nil
		}
	}
	return nil
}

// newEvent makes a message of an envelope read from the table (a lost
// slot's gap); the stream's events go through msgBuilder instead.
func (r *Relay) newEvent(ev event.Envelope, createdAt time.Time, rowID int64) cdcEvent {
	return cdcEvent{rowID: rowID, version: ev.AggregateVersion, recheck: true, Claimed: publish.Claimed{
		ID: rowID, CreatedAt: createdAt, AggType: ev.AggregateType,
		Aggregate: ev.AggregateType + "\x00" + ev.AggregateID,
		Msg:       event.ToKafka(r.cfg.Topic(ev.AggregateType), ev),
	}}
}

// idle reports that nothing decoded is waiting for Kafka: no open
// transaction and none with unacknowledged events.
func (s *streamer) idle() bool { return s.open == nil && s.txs.Len() == 0 }

// sendStatus confirms s.confirmed to the server: the slot's
// confirmed_flush_lsn moves there, and the WAL before it may be recycled.
// While idle it asks for a keepalive, whose position the next status
// confirms.
func (s *streamer) sendStatus(ctx context.Context) error {
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, ReplyRequested: s.idle(),
	})
	if err != nil {
		return fmt.Errorf("sending the standby status: %w", err)
	}
	s.lastStatus = time.Now()
	if !s.lastStatus.Before(s.nextRecord) {
		s.record(ctx)
	}
	// From now, not from before the record, which may have taken the
	// whole interval: the stream must get to read in between.
	s.nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
	return nil
}

// record writes the confirmed position to outbox_cdc_slots if it moved,
// and then, written or not, not again for RetentionInterval: a write that
// cannot get through (its row locked, the database slow) tried with every
// status update took the stream's whole time, and the stream stopped
// reading (TestCDCStreamGoesOnWhileItsSlotRecordIsLocked). Best effort, and not with
// every status update: the slot itself is the source of truth, and the
// record only bounds retention, which reads it every RetentionInterval, and
// dates a lost slot's window, which a record a few seconds old widens by
// as much (more events republished in table mode, an earlier start
// reported in WAL-only mode), never narrows.
func (s *streamer) record(ctx context.Context) {
	if s.confirmed == s.recorded && s.confirmedID == s.recordedID {
		return
	}
	recCtx, cancel := context.WithTimeout(ctx, s.r.cfg.StatusInterval)
	tag, err := s.r.pool.Exec(recCtx, recordConfirmed, s.r.cfg.Slot, s.confirmed.String(), s.confirmedID, s.generation)
	cancel()
	s.nextRecord = time.Now().Add(s.r.cfg.RetentionInterval)
	if err != nil {
		if ctx.Err() == nil {
			s.r.cfg.Metrics.DbErrors.WithLabelValues("slot").Inc()
		}
		return
	}
	if tag.RowsAffected() == 0 {
		set(s.r.cfg.Metrics).Refuse(ctx, s.r.cfg.Logger, lifecycle.TransitionRecordPosition,
			"the slot record is of another generation: the slot was lost and replaced since this stream took it",
			slog.String("slot", s.r.cfg.Slot), slog.String("lsn", s.confirmed.String()))
	}
	s.recorded, s.recordedID = s.confirmed, s.confirmedID
}
