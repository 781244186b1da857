package inboxadmin

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// Prune removes processed, stale (skipped by the version guard, under
// inbox.Config.SkipStale) and skipped (by an operator) rows whose
// processed_at is older than cfg.Retention, and the originals kept for
// truncated dead letters that are no longer dead, and returns how many rows
// it removed. Dead-lettered, requeued, leased and uncertain rows are never
// touched, however old: they are what an operator or a redelivery still has
// to settle (the transition prune of internal/state's state.go names the
// states it removes). It works oldest first in batches of cfg.BatchSize,
// each its own statement and short transaction, until a batch comes up
// short, so an interrupted Prune keeps what it removed and the next one
// resumes.
//
// It is the operator's "prune now" (or a job scheduler's); a service runs
// the same prune in the background with inbox.NewPruner.
//
// On error the count is what the batches before the failure removed.
func Prune(ctx context.Context, db inbox.DB, cfg inbox.PruneConfig) (int, error) {
	return engine.Prune(ctx, db, cfg)
}
