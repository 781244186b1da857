package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// MessageRecord is one inbox row as MessagesOf reads it.
type MessageRecord = engine.MessageRecord

// MessagesOf returns the inbox rows of every consumer in the database for
// the messages of the aggregate aggregateID, oldest first. A message pruned
// after processing is no longer listed. Errors are named as Backlog's are.
func MessagesOf(ctx context.Context, db BacklogDB, aggregateID string) ([]MessageRecord, error) {
	return engine.MessagesOf(ctx, db, aggregateID)
}
