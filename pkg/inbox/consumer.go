package inbox

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Writer publishes dead letters; *kafka.Writer satisfies it (kafkasafe's
// writer is one).
type Writer = engine.Writer

// Consumer handles the messages of one topic, in one consumer group,
// through the inbox: NewConsumer's and NewBatchConsumer's, and lease mode's
// (pkg/inbox/lease). Its methods are Run, Handle and Healthy; the
// dispatcher behind it, and both appliers' shared engine, are
// pkg/inbox/internal/engine.
type Consumer = engine.Consumer

// NewConsumer returns a consumer that reads src's topic as a member of its
// consumer group, handles each event with h in a transaction on pool, and
// dead-letters through dlq.
func NewConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, h Handler, cfg Config) (*Consumer, error) {
	return engine.NewConsumer(pool, src, dlq, h, cfg)
}

// NewBatchConsumer is NewConsumer with a handler that also applies the new
// events of a batch at once (BatchHandler.HandleBatch), in the batch's
// transaction, so that what it writes for them takes a statement or two
// instead of a few per event. Messages settled on their own (a batch that
// failed, a retry) go through its Handle.
func NewBatchConsumer(pool *pgxpool.Pool, src GroupConfig, dlq Writer, h BatchHandler, cfg Config) (*Consumer, error) {
	return engine.NewBatchConsumer(pool, src, dlq, h, cfg)
}
