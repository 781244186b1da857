package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/internal/knob"
	"github.com/onceflow/onceflow/pkg/internal/prune"
	"github.com/onceflow/onceflow/pkg/outbox/internal/pruning"
)

// DB is what NewPruner and the operator functions (package outboxadmin,
// its one-shot Prune among them) need from the caller's database handle.
// *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it; given a pgx.Tx, the
// changes commit with the caller's transaction (and a prune's batches are
// no longer separate transactions).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PruneConfig is what a prune removes: each run of a Pruner, or one
// outboxadmin.Prune. Zero fields take the documented defaults.
type PruneConfig struct {
	// Retention is how long a published row is kept after publication, the
	// window in which it can still be replayed. Default 7 days.
	Retention time.Duration
	// BatchSize is the most rows removed per statement (and transaction), so
	// pruning a large backlog never holds many locks or a long transaction.
	// Default 1000.
	BatchSize int
	// Archive moves pruned rows to outbox_events_archive, with their ids, in
	// the same statement that deletes them. Default false: delete them.
	Archive bool
	// PendingRetention, when set, also removes pending rows created longer
	// ago than this (by created_at). Default 0: pending rows are never
	// touched, which is right for every relay of this package: the polling
	// relay has yet to publish them, and the log-based relay deletes what it
	// confirmed itself (cdc.Config.Retain).
	//
	// It is for an outbox that a publisher outside the service streams from
	// the WAL and never marks (ModeDebezium), where every row stays pending.
	// Deleting a row does not take its event from that publisher: it reads
	// the row's insert from its replication slot, and the publication
	// streams no deletes. What the row still serves is the way back when
	// the stream failed: a replay (outboxadmin.Replay), and republishing the
	// window of a slot that was dropped or invalidated, which only the
	// table still holds. So set it well above the publisher's worst lag
	// plus the time to notice and repair a lost slot — days, not minutes:
	// a row pruned before its event was published cannot be republished if
	// the slot is lost.
	PendingRetention time.Duration
}

// WithDefaults returns c with every zero field set to its documented
// default; negative values are kept for Validate to refuse.
func (c PruneConfig) WithDefaults() PruneConfig {
	knob.Default(&c.Retention, 7*24*time.Hour)
	knob.Default(&c.BatchSize, 1000)
	return c
}

// Validate refuses a negative Retention, PendingRetention or BatchSize: a
// negative retention would prune rows the moment they are published.
func (c PruneConfig) Validate() error {
	if c.PendingRetention < 0 {
		return fmt.Errorf("outbox: PruneConfig.PendingRetention is negative (%v); leave it zero to keep pending rows", c.PendingRetention)
	}
	return knob.RefuseNegative("outbox: PruneConfig", c)
}

// PrunerConfig configures a Pruner: PruneConfig is what each run prunes
// (see its fields' defaults), Interval the time between runs (default 1h),
// Logger receives each run's outcome (default slog.Default()). Zero fields
// take the defaults; negative ones are refused by Validate. Both libraries'
// pruners share it (pkg/internal/prune).
type PrunerConfig = prune.Config[PruneConfig]

// Pruner prunes in the background (what outboxadmin.Prune does once), at
// start and then every Interval, until the ctx of its Run(ctx) ends.
// Several instances may run at once: batches skip rows another holds, so
// they share the work rather than collide.
type Pruner = prune.Pruner

// NewPruner returns a pruner of the outbox in db.
func NewPruner(db DB, cfg PrunerConfig) (*Pruner, error) {
	return prune.New(db, cfg, func(c PruneConfig) prune.Run {
		what := "published events"
		if c.PendingRetention > 0 {
			what = "published and expired pending events"
		}
		rows := pruning.Rows{Retention: c.Retention, PendingRetention: c.PendingRetention, BatchSize: c.BatchSize, Archive: c.Archive}
		return prune.Run{
			What: what,
			Attrs: []slog.Attr{slog.Bool("archive", c.Archive), slog.Duration("retention", c.Retention),
				slog.Duration("pending_retention", c.PendingRetention)},
			Once: func(ctx context.Context) (int, error) { return pruning.Once(ctx, db, rows, storeErr) },
		}
	})
}
