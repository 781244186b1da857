package inboxadmin

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Parked is one message held behind a dead message of its aggregate, as
// ListParked shows it to an operator.
type Parked struct {
	Consumer         string
	EventID          uuid.UUID
	EventType        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// BlockedBy is the dead message it was parked behind; zero when it was
	// parked behind earlier parked messages being released.
	BlockedBy uuid.UUID
	// Topic, Partition and Offset are where it was fetched.
	Topic     string
	Partition int
	Offset    int64
	ParkedAt  time.Time
}

// maxParkedLimit is the most parked messages one ListParked call lists.
const maxParkedLimit = 1000

// ParkedFilter selects what ListParked lists. The zero value lists the
// oldest 100 parked messages of every consumer.
type ParkedFilter struct {
	// Consumer restricts the list to one consumer (inbox.Config.Name).
	Consumer string
	// AggregateID restricts it to one aggregate.
	AggregateID string
	// Limit is the most messages listed, from 1 to 1000; 0 means
	// 100.
	Limit int
}

// Validate refuses a negative Limit, or one above 1000.
func (f ParkedFilter) Validate() error {
	if f.Limit < 0 || f.Limit > maxParkedLimit {
		return fmt.Errorf("inbox: ListParked: the limit must be from 1 to %d (0: %d), not %d", maxParkedLimit, defaultListLimit, f.Limit)
	}
	return nil
}

const listParked = `
SELECT consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
       coalesce(blocked_by, '00000000-0000-0000-0000-000000000000'), topic, kafka_partition, kafka_offset, parked_at
FROM inbox_parked_messages
WHERE ($1 = '' OR consumer = $1) AND ($2 = '' OR aggregate_id = $2)
ORDER BY consumer, aggregate_type, aggregate_id, seq
LIMIT $3`

// ListParked lists parked messages, each aggregate's in the order they will
// be released. Reads only: a read-only role may run it. They leave the
// parking when the dead message of their aggregate is requeued (see
// RequeueDeadLetters) and applied.
func ListParked(ctx context.Context, db BacklogDB, f ParkedFilter) ([]Parked, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if f.Limit == 0 {
		f.Limit = defaultListLimit
	}
	rows, err := db.Query(ctx, listParked, f.Consumer, f.AggregateID, f.Limit)
	if err != nil {
		return nil, dbErrors.Translate("inbox: listing parked messages", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		err := r.Scan(&p.Consumer, &p.EventID, &p.EventType, &p.AggregateType, &p.AggregateID, &p.AggregateVersion,
			&p.BlockedBy, &p.Topic, &p.Partition, &p.Offset, &p.ParkedAt)
		return p, err
	})
	if err != nil {
		return nil, dbErrors.Translate("inbox: listing parked messages", err)
	}
	return out, nil
}
