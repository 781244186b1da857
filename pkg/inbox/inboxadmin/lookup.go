package inboxadmin

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// MessagesOf is the inbox's read of "what did the consumers do with this
// aggregate's messages", for operators' tools (onceflowctl journey) that
// follow one aggregate across services, so that nothing outside this
// package knows the table's name or its statuses. It only SELECTs: a
// read-only role (pgroles' readers, e.g. reconcile_ro) may run it.

// MessageRecord is one inbox row as MessagesOf reads it.
type MessageRecord struct {
	Consumer         string
	MessageID        uuid.UUID
	EventType        string
	AggregateID      string
	AggregateVersion int64
	// Topic, Partition and Offset are where the consumer read the message.
	Topic     string
	Partition int
	Offset    int64
	// Status is the row's status: processed, leased, uncertain, stale,
	// dead_lettered, requeued, skipped (pkg/inbox/internal/state), or one a later version
	// of the library adds.
	Status    string
	Attempts  int
	LastError string
	// ReceivedAt is when the consumer first recorded the message.
	ReceivedAt time.Time
	// ProcessedAt is when its effect was recorded (nil while it is not).
	ProcessedAt *time.Time
	// LeaseOwner and LeaseUntil are set while a lease-mode worker holds it.
	LeaseOwner string
	LeaseUntil *time.Time
}

// sqlMessagesOf: $1 the aggregate id, every consumer in the database.
const sqlMessagesOf = `
	SELECT consumer, message_id, event_type, aggregate_id, aggregate_version, topic, kafka_partition, kafka_offset,
	       status, attempts, coalesce(last_error, ''), received_at, processed_at, coalesce(lease_owner, ''), lease_until
	  FROM inbox_messages WHERE aggregate_id = $1
	 ORDER BY received_at, consumer, message_id`

// MessagesOf returns the inbox rows of every consumer in the database for
// the messages of the aggregate aggregateID, oldest first. A message pruned
// after processing is no longer listed. Errors are named as Backlog's are.
func MessagesOf(ctx context.Context, db BacklogDB, aggregateID string) ([]MessageRecord, error) {
	rows, err := db.Query(ctx, sqlMessagesOf, aggregateID)
	if err != nil {
		return nil, dbErrors.Translate("inbox: reading an aggregate's messages", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MessageRecord, error) {
		var m MessageRecord
		err := r.Scan(&m.Consumer, &m.MessageID, &m.EventType, &m.AggregateID, &m.AggregateVersion, &m.Topic,
			&m.Partition, &m.Offset, &m.Status, &m.Attempts, &m.LastError, &m.ReceivedAt, &m.ProcessedAt,
			&m.LeaseOwner, &m.LeaseUntil)
		return m, err
	})
	if err != nil {
		return nil, dbErrors.Translate("inbox: reading an aggregate's messages", err)
	}
	return out, nil
}
