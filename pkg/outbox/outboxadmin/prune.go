package outboxadmin

import (
	"context"

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/internal/pruning"
)

// Prune removes published rows older than cfg.Retention (by published_at),
// and with cfg.PendingRetention set pending rows older than that (by
// created_at), deleting or archiving them per cfg.Archive, and returns how
// many it removed. Dead rows are never touched, however old, and pending
// ones only as PendingRetention says: they are work not yet done. It works
// oldest first in batches of cfg.BatchSize, each its own statement and short
// transaction, until a batch comes up short, so an interrupted Prune keeps
// what it removed and the next one resumes.
//
// It is the operator's "prune now" (or a job scheduler's); a service runs
// the same prune in the background with outbox.NewPruner.
//
// On error the count is what the batches before the failure removed.
func Prune(ctx context.Context, db outbox.DB, cfg outbox.PruneConfig) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	cfg = cfg.WithDefaults()
	return pruning.Once(ctx, db, pruning.Rows{
		Retention: cfg.Retention, PendingRetention: cfg.PendingRetention, BatchSize: cfg.BatchSize, Archive: cfg.Archive,
	}, storeErr)
}
