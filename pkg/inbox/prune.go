package inbox

import (
	"github.com/onceflow/onceflow/pkg/inbox/internal/engine"
)

// PruneConfig is what a prune removes: each run of a Pruner, or one
// inboxadmin.Prune. Zero fields take the documented defaults; negative ones
// are refused by Validate.
type PruneConfig = engine.PruneConfig

// DB is what NewPruner and inboxadmin.Prune need from the caller's database
// handle. *pgxpool.Pool and *pgx.Conn satisfy it. Given a pgx.Tx, a prune's
// batches commit with the caller's transaction instead of one by one.
type DB = engine.DB

// PrunerConfig configures a Pruner: PruneConfig is what each run prunes
// (see its fields' defaults), Interval the time between runs (default
// 1h), Logger receives each run's outcome (default
// slog.Default()). Zero fields take the defaults; negative ones are refused
// by Validate. Both libraries' pruners share it (pkg/internal/prune).
type PrunerConfig = engine.PrunerConfig

// Pruner prunes in the background (what inboxadmin.Prune does once), at
// start and then every Interval, until the ctx of its Run(ctx) ends.
// Several instances may run at once: batches skip rows another holds, so
// they share the work rather than collide.
type Pruner = engine.Pruner

// NewPruner returns a pruner of the inbox in db.
func NewPruner(db DB, cfg PrunerConfig) (*Pruner, error) {
	return engine.NewPruner(db, cfg)
}
