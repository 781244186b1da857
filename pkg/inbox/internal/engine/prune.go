package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox/internal/state"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/internal/prune"
)

// Pruning removes the rows of handled events once no redelivery can reach
// them. Retention compares against the database's now(): processed_at was
// stamped by that clock, so the comparison is immune to skew between
// application hosts.

// The defaults of PruneConfig's and PrunerConfig's fields, which a zero
// field takes.
const (
	DefaultRetention      = 30 * 24 * time.Hour
	DefaultPruneBatchSize = 1000
	DefaultPruneInterval  = prune.DefaultInterval
)

// PruneConfig configures Prune. Zero fields take the documented defaults;
// negative ones are refused by Validate.
type PruneConfig struct {
	// Retention is how long the row of a handled event is kept after
	// processed_at. Default 30 days.
	//
	// The row is what makes a redelivery a no-op: once it is pruned, the
	// same event delivered again runs the handler again. So Retention must
	// be longer than any window in which the event can come back: the
	// retention of the topic in Kafka (a consumer group reset to the
	// earliest offset rereads all of it), plus the producer's replay window
	// (outbox.PruneConfig.Retention, since outbox.Replay republishes under
	// the original event ids), plus the time a dead letter may wait before
	// it is requeued.
	Retention time.Duration
	// BatchSize is the most rows removed per statement (and transaction), so
	// pruning a large backlog never holds many locks or a long transaction.
	// Default 1000.
	BatchSize int
}

// WithDefaults returns c with every zero field set to its documented
// default; negative values are kept for Validate to refuse.
func (c PruneConfig) WithDefaults() PruneConfig {
	knob.Default(&c.Retention, DefaultRetention)
	knob.Default(&c.BatchSize, DefaultPruneBatchSize)
	return c
}

// Validate refuses a negative Retention or BatchSize: a negative retention
// would prune rows the moment they are processed.
func (c PruneConfig) Validate() error {
	return knob.RefuseNegative("inbox: PruneConfig", c)
}

// DB is what Prune needs from the caller's database handle. *pgxpool.Pool
// and *pgx.Conn satisfy it. Given a pgx.Tx, Prune's batches commit with the
// caller's transaction instead of one by one.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Prune removes processed, stale (skipped by the version guard, under
// SkipStale) and skipped (by an operator) rows whose processed_at is older
// than cfg.Retention, and the originals kept for truncated dead letters
// that are no longer dead, and returns how many rows it removed.
// Dead-lettered, requeued, leased and uncertain rows are never touched,
// however old: they are what an operator or a redelivery still has to
// settle (the transition prune of state.go names the states it removes). It works oldest first in batches of cfg.BatchSize, each its
// own statement and short transaction, until a batch comes up short, so an
// interrupted Prune keeps what it removed and the next one resumes.
//
// On error the count is what the batches before the failure removed.
func Prune(ctx context.Context, db DB, cfg PruneConfig) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	cfg = cfg.WithDefaults()
	total, err := prune.Batches(ctx, db, state.Prune.SQL, cfg.Retention, cfg.BatchSize)
	if err != nil {
		return total, fmt.Errorf("inbox: pruning processed messages: %w", err)
	}
	// The originals kept for truncated dead letters go once their letter
	// is no longer dead (applied, skipped, pruned), after Retention.
	if _, err := state.Take(ctx, db, &state.PruneOriginals, cfg.Retention.Microseconds()); err != nil {
		return total, fmt.Errorf("inbox: pruning the originals of truncated dead letters: %w", err)
	}
	return total, nil
}

// PrunerConfig configures a Pruner: PruneConfig is what each run prunes
// (see its fields' defaults), Interval the time between runs (default
// 1h), Logger receives each run's outcome (default
// slog.Default()). Zero fields take the defaults; negative ones are refused
// by Validate. Both libraries' pruners share it (pkg/internal/prune).
type PrunerConfig = prune.Config[PruneConfig]

// Pruner runs Prune in the background, once at start and then every
// Interval, until the ctx of its Run(ctx) ends. Several instances may run
// at once: batches skip rows another holds, so they share the work rather
// than collide.
type Pruner = prune.Pruner

// NewPruner returns a pruner of the inbox in db.
func NewPruner(db DB, cfg PrunerConfig) (*Pruner, error) {
	return prune.New(db, cfg, func(c PruneConfig) prune.Run {
		return prune.Run{
			What:  "processed messages",
			Attrs: []slog.Attr{slog.Duration("retention", c.Retention)},
			Once:  func(ctx context.Context) (int, error) { return Prune(ctx, db, c) },
		}
	})
}
