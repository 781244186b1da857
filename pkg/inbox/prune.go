package inbox

import (
	"context"

	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// PruneConfig configures Prune. Zero fields take the documented defaults;
// negative ones are refused by Validate.
type PruneConfig = engine.PruneConfig

// DB is what Prune needs from the caller's database handle. *pgxpool.Pool
// and *pgx.Conn satisfy it. Given a pgx.Tx, Prune's batches commit with the
// caller's transaction instead of one by one.
type DB = engine.DB

// Prune removes processed, stale (skipped by the version guard, under
// StaleSkip) and skipped (by an operator) rows whose processed_at is older
// than cfg.Retention, and the originals kept for truncated dead letters
// that are no longer dead, and returns how many rows it removed.
// Dead-lettered, requeued, leased and uncertain rows are never touched,
// however old: they are what an operator or a redelivery still has to
// settle (the transition prune of internal/state's state.go names the states it removes). It works oldest first in batches of cfg.BatchSize, each its
// own statement and short transaction, until a batch comes up short, so an
// interrupted Prune keeps what it removed and the next one resumes.
//
// On error the count is what the batches before the failure removed.
func Prune(ctx context.Context, db DB, cfg PruneConfig) (int, error) {
	return engine.Prune(ctx, db, cfg)
}

// PrunerConfig configures a Pruner: PruneConfig is what each run prunes
// (see its fields' defaults), Interval the time between runs (default
// 1h), Logger receives each run's outcome (default
// slog.Default()). Zero fields take the defaults; negative ones are refused
// by Validate. Both libraries' pruners share it (pkg/internal/prune).
type PrunerConfig = engine.PrunerConfig

// Pruner runs Prune in the background, once at start and then every
// Interval, until the ctx of its Run(ctx) ends. Several instances may run
// at once: batches skip rows another holds, so they share the work rather
// than collide.
type Pruner = engine.Pruner

// NewPruner returns a pruner of the inbox in db.
func NewPruner(db DB, cfg PrunerConfig) (*Pruner, error) {
	return engine.NewPruner(db, cfg)
}
