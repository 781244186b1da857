package outbox

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/pkg/event"
)

// cdcEvent is one event decoded from the stream (or, after a lost slot,
// read from the table).
type cdcEvent struct {
	claimed
	rowID int64 // outbox_events id; 0 for an emitted event
	tx    *txn  // the transaction it belongs to, for the slot's confirmation
}

// txn is a decoded transaction whose events are not all acknowledged yet.
// The slot may be confirmed past a transaction's commit only once every
// event of it, and of every transaction before it, is acknowledged (or
// skipped as dead): the events themselves go to Kafka as soon as they are
// decoded, in chunks, whatever the transaction's size.
type txn struct {
	end     pglogrepl.LSN // commit end; set when the commit is decoded
	sealed  bool          // its commit was decoded: no more events will join
	pending int           // events handed to a lane and not yet acknowledged
	maxID   int64         // highest outbox id among its events
	elem    *list.Element // in streamer.txs
}

// streamer is the state of one replication connection. Only its own
// goroutine uses the connection and the transaction list; the lanes
// publish, one per topic, and report back on acked.
type streamer struct {
	r    *CDCRelay
	conn *pgconn.PgConn // nil while the gap of a lost slot is replayed

	relations map[uint32]*pglogrepl.RelationMessage
	open      *txn

	// txs holds, oldest first, the transactions with events not yet
	// acknowledged (and the open one). A transaction whose events are all
	// acknowledged while an older one is not is merged into that older one,
	// so the list never holds more than the events in flight, however long
	// one topic stays down while the others flow.
	txs list.List

	lanes     map[string]*lane
	acked     chan laneAck
	laneCtx   context.Context //nolint:containedctx // the lanes' lifetime: this connection's
	stopLanes context.CancelFunc
	laneWG    sync.WaitGroup

	confirmed   pglogrepl.LSN // acknowledged by Kafka (or holding no events)
	confirmedID int64
	recorded    pglogrepl.LSN // last confirmed position written to outbox_cdc_slots
	nextStatus  time.Time
}

func newStreamer(ctx context.Context, r *CDCRelay, start pglogrepl.LSN) *streamer {
	s := &streamer{r: r, relations: map[uint32]*pglogrepl.RelationMessage{}, lanes: map[string]*lane{},
		acked: make(chan laneAck, 16), confirmed: start, recorded: start}
	s.txs.Init()
	s.laneCtx, s.stopLanes = context.WithCancel(ctx)
	return s
}

// close stops the lanes: what they hold and did not report acknowledged is
// not confirmed, so the next stream starts before it.
func (s *streamer) close() {
	s.stopLanes()
	s.laneWG.Wait()
}

func (r *CDCRelay) streamOnce(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, r.replConf)
	if err != nil {
		return fmt.Errorf("connecting for replication: %w", err)
	}
	// Closing without a last status update is what a crash does: the slot
	// keeps the last confirmed position, and the next relay starts there.
	defer conn.Close(context.Background()) //nolint:errcheck // the connection is done either way
	if err := r.ensurePublication(ctx, conn); err != nil {
		return err
	}
	if err := r.ensureSlot(ctx, conn); err != nil {
		return err
	}
	var start pglogrepl.LSN
	var lsnText string
	if err := r.pool.QueryRow(ctx, slotConfirmed, r.cfg.Slot).Scan(&lsnText); err != nil {
		return fmt.Errorf("reading the slot's confirmed position: %w", err)
	}
	if start, err = pglogrepl.ParseLSN(lsnText); err != nil {
		return fmt.Errorf("parsing the slot's confirmed position: %w", err)
	}
	s := newStreamer(ctx, r, start)
	defer s.close()
	// Before the slot's first event: the rows a new slot's stream does not
	// carry go first, so each aggregate stays in order.
	if err := s.replayGap(ctx); err != nil {
		return err
	}
	// proto_version 1 suffices: pgoutput sends logical decoding messages
	// with messages 'true' since Postgres 14. With version 1 a transaction
	// is sent only once it committed (decoding waits for the commit record),
	// so its events may be published while the rest of it is still being
	// decoded; the slot is confirmed past it only once all are acknowledged.
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return slotErr("starting replication", err)
	}
	s.conn = conn
	r.setActive(true)
	r.stream.ok(ctx)
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
	s.nextStatus = time.Time{} // confirm now
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
		wait := time.NewTimer(max(time.Until(s.nextStatus), 0))
		select {
		case l.in <- ev:
			wait.Stop()
			return nil
		case a := <-s.acked:
			wait.Stop()
			if err := s.noteAcked(a); err != nil {
				return err
			}
		case <-wait.C:
			if err := s.sendStatus(ctx); err != nil {
				return err
			}
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		}
	}
}

// add hands one decoded event to its topic's lane, starting the lane on
// the topic's first event.
func (s *streamer) add(ctx context.Context, ev cdcEvent) error {
	l := s.lanes[ev.msg.Topic]
	if l == nil {
		l = s.r.newLane(ev.msg.Topic, s.acked)
		s.lanes[ev.msg.Topic] = l
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
		recvCtx, cancel := context.WithDeadline(ctx, s.nextStatus)
		raw, err := s.conn.ReceiveMessage(recvCtx)
		cancel()
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
	msg, err := pglogrepl.Parse(x.WALData)
	if err != nil {
		return fmt.Errorf("parsing a pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.BeginMessage:
		s.open = s.begin()
	case *pglogrepl.RelationMessage:
		s.relations[m.RelationID] = m
	case *pglogrepl.InsertMessage:
		rel := s.relations[m.RelationID]
		if rel == nil || rel.RelationName != "outbox_events" || s.open == nil {
			return nil
		}
		ev, err := s.r.decodeRow(rel, m.Tuple)
		if err != nil {
			// A row Postgres accepted but the relay cannot read is a bug or
			// a schema the relay does not know; skipping it would lose it.
			return fmt.Errorf("decoding an outbox row: %w", err)
		}
		ev.tx = s.open
		return s.add(ctx, ev)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != EmitPrefix {
			return nil
		}
		if !m.Transactional || s.open == nil {
			// Emit writes transactional messages only; anything else under
			// its prefix was written by hand and is not an outbox event.
			s.r.refuseEmitted(ctx, refusedNonTransactional, errors.New("not transactional"), m.LSN, m.Content)
			return nil
		}
		env, emitted, reason, err := decodeEmitted(m.Content)
		if err != nil {
			// Never a stall: the stream goes on past a message it refuses.
			s.r.refuseEmitted(ctx, reason, err, m.LSN, m.Content)
			return nil
		}
		ev := s.r.newEvent(env, emitted, 0)
		ev.tx = s.open
		return s.add(ctx, ev)
	case *pglogrepl.CommitMessage:
		if s.open != nil {
			s.seal(s.open, m.TransactionEndLSN)
			s.open = nil
		}
	}
	return nil
}

func (r *CDCRelay) newEvent(ev event.Envelope, createdAt time.Time, rowID int64) cdcEvent {
	return cdcEvent{rowID: rowID, claimed: claimed{
		id: rowID, createdAt: createdAt, aggType: ev.AggregateType,
		aggregate: ev.AggregateType + "\x00" + ev.AggregateID,
		msg:       event.ToKafka(r.cfg.Topic(ev.AggregateType), ev),
	}}
}

// decodeRow reads an outbox_events insert (pgoutput's text format) into
// the same envelope the polling relay reads from the table.
func (r *CDCRelay) decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (cdcEvent, error) {
	if tuple == nil || len(tuple.Columns) != len(rel.Columns) {
		return cdcEvent{}, errors.New("tuple does not match its relation")
	}
	var (
		ev        event.Envelope
		rowID     int64
		headers   envelopeHeaders
		createdAt time.Time
		err       error
	)
	for i, col := range rel.Columns {
		data := tuple.Columns[i].Data
		if tuple.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			continue // null: only optional columns (last_error, published_at)
		}
		text := string(data)
		switch col.Name {
		case "id":
			rowID, err = strconv.ParseInt(text, 10, 64)
		case "event_id":
			ev.EventID, err = uuid.Parse(text)
		case "aggregate_type":
			ev.AggregateType = text
		case "aggregate_id":
			ev.AggregateID = text
		case "aggregate_version":
			ev.AggregateVersion, err = strconv.ParseInt(text, 10, 64)
		case "event_type":
			ev.EventType = text
		case "event_version":
			ev.EventVersion, err = strconv.Atoi(text)
		case "payload":
			ev.Payload = json.RawMessage(text)
		case "headers":
			err = json.Unmarshal(data, &headers)
		case "occurred_at":
			err = r.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, data, &ev.OccurredAt)
		case "created_at":
			err = r.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, data, &createdAt)
		}
		if err != nil {
			return cdcEvent{}, fmt.Errorf("column %s: %w", col.Name, err)
		}
	}
	ev.CorrelationID, ev.CausationID, ev.Traceparent = headers.CorrelationID, headers.CausationID, headers.Traceparent
	return r.newEvent(ev, createdAt, rowID), nil
}

// idle reports that nothing decoded is waiting for Kafka: no open
// transaction and none with unacknowledged events.
func (s *streamer) idle() bool { return s.open == nil && s.txs.Len() == 0 }

// sendStatus confirms s.confirmed to the server: the slot's
// confirmed_flush_lsn moves there, and the WAL before it may be recycled.
// While idle it asks for a keepalive, whose position the next status
// confirms.
func (s *streamer) sendStatus(ctx context.Context) error {
	if s.conn == nil {
		// Replaying a gap before the stream starts: nothing to confirm yet.
		s.nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
		return nil
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, ReplyRequested: s.idle(),
	})
	if err != nil {
		return fmt.Errorf("sending the standby status: %w", err)
	}
	s.nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
	if s.confirmed != s.recorded {
		// Best effort: the record only dates a lost slot's window and
		// bounds retention; the slot itself is the source of truth.
		recCtx, cancel := context.WithTimeout(ctx, s.r.cfg.StatusInterval)
		_, err := s.r.pool.Exec(recCtx, recordConfirmed, s.r.cfg.Slot, s.confirmed.String(), s.confirmedID)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.r.cfg.Metrics.dbErrors.WithLabelValues("slot").Inc()
			}
		} else {
			s.recorded = s.confirmed
		}
	}
	return nil
}
