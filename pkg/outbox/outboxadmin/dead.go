package outboxadmin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/event"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/lifecycle"
	"github.com/onceflow/onceflow/pkg/outbox/internal/publish"
	"github.com/onceflow/onceflow/pkg/outbox/internal/wal"
)

// DeadEvent is an outbox row that exhausted its publish attempts.
type DeadEvent struct {
	ID               int64
	EventID          uuid.UUID
	EventType        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Attempts is how many publishes failed.
	Attempts int
	// LastError is the last failure, the reason the row is dead.
	LastError string
	CreatedAt time.Time
}

// ListDead returns up to limit dead events, oldest first, so an operator can
// see what failed and why before requeuing it. A limit <= 0 means 100.
func ListDead(ctx context.Context, db outbox.DB, limit int) ([]DeadEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, listDead, limit)
	if err != nil {
		return nil, storeErr("listing dead events", err)
	}
	dead, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadEvent, error) {
		var d DeadEvent
		err := row.Scan(&d.ID, &d.EventID, &d.EventType, &d.AggregateType, &d.AggregateID,
			&d.AggregateVersion, &d.Attempts, &d.LastError, &d.CreatedAt)
		return d, err
	})
	if err != nil {
		return nil, storeErr("reading dead events", err)
	}
	return dead, nil
}

// DeadFilter selects dead rows for RequeueDead. Empty fields match anything.
type DeadFilter struct {
	AggregateType string
	AggregateID   string
	// Limit is the most rows requeued, oldest first. <= 0 means no limit.
	Limit int
}

// Requeue sets the dead rows among ids back to pending with a fresh budget
// of attempts, written again as a service whose relay runs in mode m needs
// (see errors.go; requeueSet for what happens to last_error), and returns
// how many it requeued. In outbox.ModePoll ids of rows that are not dead
// are ignored, so requeuing is safe to repeat; in outbox.ModeCDC and
// outbox.ModeWAL a requeued row leaves under its id, so a repeated call
// naming the same ids is refused with ErrNotFound instead of counting 0,
// and in outbox.ModeWAL a call that finds no dead row is refused with
// ErrNotInThisMode. If an id names no row (mistyped, or pruned since), it
// requeues nothing and returns an error wrapping ErrNotFound that lists the
// unknown ids.
//
// While a row is dead the relay holds back the later events of its
// aggregate (see package outbox's documentation); requeuing it releases
// them, to be published after it, in order.
func Requeue(ctx context.Context, db outbox.DB, m outbox.RelayMode, ids ...int64) (int, error) {
	switch m {
	case outbox.ModePoll:
		return requeuePoll(ctx, db, ids)
	case outbox.ModeCDC, outbox.ModeDebezium:
		return requeueCopyIDs(ctx, db, ids)
	case outbox.ModeWAL:
		return requeueEmitIDs(ctx, db, ids)
	}
	return 0, errUnknownMode(m)
}

// RequeueDead is Requeue for every dead row matching f, oldest first; it
// returns how many it requeued. The zero filter requeues every dead row,
// which is what an operator wants once the cause (a missing topic, a broker
// outage) is fixed. See Requeue for how each mode writes the event again.
func RequeueDead(ctx context.Context, db outbox.DB, m outbox.RelayMode, f DeadFilter) (int, error) {
	var limit any // nil: LIMIT NULL, no limit
	if f.Limit > 0 {
		limit = f.Limit
	}
	switch m {
	case outbox.ModePoll:
		return requeueDeadPoll(ctx, db, f.AggregateType, f.AggregateID, limit)
	case outbox.ModeCDC, outbox.ModeDebezium:
		tag, err := db.Exec(ctx, requeueCopyDead, f.AggregateType, f.AggregateID, limit)
		if err != nil {
			return 0, storeErr("requeuing dead events", err)
		}
		if n := int(tag.RowsAffected()); n > 0 || m == outbox.ModeCDC {
			return n, nil
		}
		return 0, fmt.Errorf("%w: RELAY_MODE=debezium keeps no dead events: Debezium never marks an outbox row dead "+
			"(a record Kafka refuses fails the connector's task: see the task's status and trace in Kafka Connect, "+
			"GET /connectors/<name>/status), so there is nothing to requeue; dead rows here only come from a time this "+
			"outbox ran another relay mode", ErrNotInThisMode)
	case outbox.ModeWAL:
		return requeueEmitDead(ctx, db, f.AggregateType, f.AggregateID, limit)
	}
	return 0, errUnknownMode(m)
}

func requeuePoll(ctx context.Context, db outbox.DB, ids []int64) (int, error) {
	n, err := requeueByID(ctx, db, requeueIDs, ids, "pruned rows are gone")
	if err != nil {
		return 0, err
	}
	return wake(ctx, db, n), nil
}

func requeueDeadPoll(ctx context.Context, db outbox.DB, aggType, aggID string, limit any) (int, error) {
	tag, err := db.Exec(ctx, requeueDead, aggType, aggID, limit)
	if err != nil {
		return 0, storeErr("requeuing dead events", err)
	}
	return wake(ctx, db, int(tag.RowsAffected())), nil
}

func requeueCopyIDs(ctx context.Context, db outbox.DB, ids []int64) (int, error) {
	return requeueByID(ctx, db, requeueCopyIDsSQL, ids,
		"a requeued or replayed row was written again under a new id, and pruned rows are gone")
}

// requeueByID runs stmt, a requeue of the dead rows among ids that reports
// how many it requeued and which ids name no row (requeueReport), and
// refuses those ids; gone says where such a row may have gone.
func requeueByID(ctx context.Context, db outbox.DB, stmt string, ids []int64, gone string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var (
		n       int
		unknown []int64
	)
	rows, err := db.Query(ctx, stmt, ids)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&n, &unknown}, func() error { return nil })
	}
	if err != nil {
		return 0, storeErr(fmt.Sprintf("requeuing %d ids", len(ids)), err)
	}
	if len(unknown) > 0 {
		return 0, fmt.Errorf("%w: no outbox row has id %s (nothing was requeued; %s)", ErrNotFound, listIDs(unknown), gone)
	}
	return n, nil
}

// requeueEmitIDs is requeueIDs for outbox.ModeWAL: the same refusal of unknown
// ids, then each dead row among them emitted and deleted.
func requeueEmitIDs(ctx context.Context, db outbox.DB, ids []int64) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return inTx(ctx, db, func(tx pgx.Tx) (int, error) {
		var unknown []int64
		if err := tx.QueryRow(ctx, unknownIDs, ids).Scan(&unknown); err != nil {
			return 0, storeErr("looking up ids to requeue", err)
		}
		if len(unknown) > 0 {
			return 0, fmt.Errorf("%w: no outbox row has id %s (nothing was requeued; a requeued row was emitted "+
				"into the WAL and left the table, and pruned rows are gone)", ErrNotFound, listIDs(unknown))
		}
		return emitDead(ctx, tx, selectDeadIDs, ids)
	})
}

// requeueEmitDead is requeueDead for outbox.ModeWAL; finding nothing to requeue is
// refused, since the WAL-only relay never leaves a dead row behind.
func requeueEmitDead(ctx context.Context, db outbox.DB, aggType, aggID string, limit any) (int, error) {
	return inTx(ctx, db, func(tx pgx.Tx) (int, error) {
		n, err := emitDead(ctx, tx, selectDeadFiltered, aggType, aggID, limit)
		if err == nil && n == 0 {
			err = fmt.Errorf("%w: RELAY_MODE=wal keeps no dead events: an event Kafka refused is logged with its event id "+
				"and counted in outbox_dead_total, not stored, so there is nothing to requeue; write it again from the domain data",
				ErrNotInThisMode)
		}
		return n, err
	})
}

// inTx runs f in a transaction of db and commits it if f succeeds.
func inTx(ctx context.Context, db outbox.DB, f func(pgx.Tx) (int, error)) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, storeErr("beginning requeue", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	n, err := f(tx)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, storeErr("committing requeue", err)
	}
	return n, nil
}

// emitDead emits the dead rows query selects into the WAL, in id order, and
// deletes them: the WAL-only relay publishes them at tx's commit.
func emitDead(ctx context.Context, tx pgx.Tx, query string, args ...any) (int, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return 0, storeErr("reading dead events", err)
	}
	type deadRow struct {
		id      int64
		ev      event.Envelope
		headers []byte
	}
	dead, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (deadRow, error) {
		var (
			d       deadRow
			payload []byte
		)
		err := row.Scan(&d.id, &d.ev.EventID, &d.ev.EventType, &d.ev.EventVersion, &d.ev.AggregateType,
			&d.ev.AggregateID, &d.ev.AggregateVersion, &payload, &d.headers, &d.ev.OccurredAt)
		d.ev.Payload = payload
		return d, err
	})
	if err != nil {
		return 0, storeErr("reading dead events", err)
	}
	ids := make([]int64, len(dead))
	for i, d := range dead {
		var h publish.Headers
		if err := json.Unmarshal(d.headers, &h); err != nil {
			return 0, fmt.Errorf("outbox: requeuing row %d: %w: headers: %w", d.id, publish.ErrUndecodable, err)
		}
		d.ev.CorrelationID, d.ev.CausationID, d.ev.Traceparent = h.CorrelationID, h.CausationID, h.Traceparent
		if err := wal.Emit(ctx, tx, d.ev); err != nil {
			return 0, storeErr(fmt.Sprintf("emitting row %d", d.id), err)
		}
		ids[i] = d.id
	}
	if _, err := tx.Exec(ctx, deleteIDs, ids); err != nil {
		return 0, storeErr("deleting emitted rows", err)
	}
	return len(dead), nil
}

// listIDs spells ids for an error message, the first ten of them.
func listIDs(ids []int64) string {
	const most = 10
	s := make([]string, 0, most+1)
	for _, id := range ids[:min(len(ids), most)] {
		s = append(s, strconv.FormatInt(id, 10))
	}
	if len(ids) > most {
		s = append(s, fmt.Sprintf("and %d more", len(ids)-most))
	}
	return strings.Join(s, ", ")
}

// wake tells the relays that n rows became due, so they need not wait for
// their poll. A lost wake-up only costs that poll, so its error is ignored.
func wake(ctx context.Context, db outbox.DB, n int) int {
	if n > 0 {
		_, _ = db.Exec(ctx, lifecycle.WakeRelays)
	}
	return n
}
