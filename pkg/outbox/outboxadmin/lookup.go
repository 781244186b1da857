package outboxadmin

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// EventsOf is the outbox's read of "what did this aggregate emit", for
// operators' tools (onceflowctl journey) that follow one aggregate across
// services, so that nothing outside this package knows the table's name,
// its archive or its states. It only SELECTs: a read-only role (pgroles'
// readers, e.g. reconcile_ro) may run it.

// EventRecord is one outbox row of an aggregate as EventsOf reads it.
type EventRecord struct {
	// ID is the row's insertion order (the relay publishes in id order).
	ID               int64
	EventID          uuid.UUID
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	// State is pending, published or dead. Log-based relays (outbox.ModeCDC)
	// never update a row: theirs stay pending until retention deletes them.
	State     string
	Attempts  int
	LastError string
	// CreatedAt is when the row was written, in the domain change's
	// transaction.
	CreatedAt time.Time
	// PublishedAt is when the polling relay marked it published (nil
	// otherwise).
	PublishedAt *time.Time
	// Archived: the row was read from the archive that retention moves
	// published rows to (PruneConfig.Archive).
	Archived bool
}

// sqlEventsOf reads both the live table and the archive, $1 the aggregate
// id: an operator following an old aggregate still finds its events after
// retention moved them. A row in both (moved while this ran) counts once,
// the live one.
const sqlEventsOf = `
	SELECT id, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, state, attempts,
	       coalesce(last_error, ''), created_at, published_at, false
	  FROM outbox_events WHERE aggregate_id = $1
	UNION ALL
	SELECT a.id, a.event_id, a.aggregate_type, a.aggregate_id, a.aggregate_version, a.event_type, a.state, a.attempts,
	       coalesce(a.last_error, ''), a.created_at, a.published_at, true
	  FROM outbox_events_archive a WHERE a.aggregate_id = $1
	   AND NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.id = a.id)
	 ORDER BY 10, 1`

// EventsOf returns the outbox rows of every aggregate whose id is
// aggregateID (of any aggregate type), oldest first, from the table and its
// archive. An event written with Emit (outbox.ModeWAL) has no row and is not
// listed; neither is a row retention deleted without archiving. Errors are
// named as Backlog's are.
func EventsOf(ctx context.Context, db BacklogDB, aggregateID string) ([]EventRecord, error) {
	rows, err := db.Query(ctx, sqlEventsOf, aggregateID)
	if err != nil {
		return nil, storeErr("reading an aggregate's events", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventRecord, error) {
		var e EventRecord
		err := r.Scan(&e.ID, &e.EventID, &e.AggregateType, &e.AggregateID, &e.AggregateVersion, &e.EventType,
			&e.State, &e.Attempts, &e.LastError, &e.CreatedAt, &e.PublishedAt, &e.Archived)
		return e, err
	})
	if err != nil {
		return nil, storeErr("reading an aggregate's events", err)
	}
	return out, nil
}
