// Package prune is the one pruner of both libraries: the batch loop that
// removes old rows one short transaction at a time, and the background
// pruner that runs it at start and then every interval, each run's outcome
// logged once. What a run removes (processed inbox rows, published outbox
// rows) and the statement that removes it are the library's.
package prune

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/internal/periodic"
)

// DefaultInterval is the time between runs when a library's PrunerConfig
// leaves Interval zero.
const DefaultInterval = time.Hour

// Execer runs one statement: the library's DB, a pool, a connection or a
// transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Batches runs stmt, which removes at most $2 rows older than $1
// microseconds, until a batch comes up short, and returns how many rows
// all of them removed. Each batch is its own statement, so with a pool it
// is its own short transaction: an interrupted run keeps what it removed
// and the next one resumes. On error the count is what the batches before
// the failure removed.
func Batches(ctx context.Context, db Execer, stmt string, retention time.Duration, batchSize int) (int, error) {
	total := 0
	for {
		tag, err := db.Exec(ctx, stmt, retention.Microseconds(), batchSize)
		if err != nil {
			return total, err
		}
		n := int(tag.RowsAffected())
		total += n
		if n < batchSize {
			return total, nil
		}
	}
}

// Rows is a library's PruneConfig: what one run removes, with the
// library's zero-means-default and negative-is-refused convention.
type Rows[P any] interface {
	WithDefaults() P
	Validate() error
}

// Config is both libraries' PrunerConfig: what each run prunes and how
// often. Zero fields take the documented defaults; negative ones are
// refused by Validate.
type Config[P Rows[P]] struct {
	// PruneConfig is what each run prunes; see its fields' defaults.
	PruneConfig P
	// Interval is the time between runs. Default DefaultInterval (1h).
	Interval time.Duration
	// Logger receives each run's outcome. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every zero field set to its documented
// default; negative values are kept for Validate to refuse.
func (c Config[P]) WithDefaults() Config[P] {
	c.PruneConfig = c.PruneConfig.WithDefaults()
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate refuses what PruneConfig.Validate refuses, and a negative
// Interval.
func (c Config[P]) Validate() error {
	if err := c.PruneConfig.Validate(); err != nil {
		return err
	}
	if c.Interval < 0 {
		return fmt.Errorf("%s: PrunerConfig.Interval is negative (%v); leave it zero for the default", lib[P](), c.Interval)
	}
	return nil
}

// lib is the library whose PruneConfig P is ("inbox", "outbox"), which
// prefixes its errors and log messages: the package that defines P, or,
// when that is one of a library's internal packages (pkg/inbox's engine),
// the library above it.
func lib[P any]() string {
	pkg := reflect.TypeFor[P]().PkgPath()
	if i := strings.Index(pkg, "/internal/"); i >= 0 {
		pkg = pkg[:i]
	}
	return path.Base(pkg)
}

// Run is one library's prune run, given its PruneConfig with defaults.
type Run struct {
	// What names the rows a run removes, for the log: "processed messages".
	What string
	// Attrs describe the configuration in each run's log line.
	Attrs []slog.Attr
	// Once runs one prune and returns how many rows it removed.
	Once func(ctx context.Context) (int, error)
}

// Pruner runs a library's Prune in the background, once at start and then
// every Interval. Several instances may run at once: batches skip rows
// another holds, so they share the work rather than collide.
type Pruner struct {
	lib      string
	interval time.Duration
	logger   *slog.Logger
	run      Run
}

// New returns the pruner that run describes, refusing a missing database
// (db is the library's DB, nil if the caller gave none) and what
// cfg.Validate refuses.
func New[P Rows[P]](db Execer, cfg Config[P], run func(P) Run) (*Pruner, error) {
	if db == nil {
		return nil, errors.New(lib[P]() + ": NewPruner needs a database")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	return &Pruner{lib: lib[P](), interval: cfg.Interval, logger: cfg.Logger, run: run(cfg.PruneConfig)}, nil
}

// Run prunes until ctx ends, then returns nil. A failed run is logged and
// retried at the next interval; it does not stop the pruner.
func (p *Pruner) Run(ctx context.Context) error {
	periodic.Run(ctx, p.interval, p.once)
	return nil
}

func (p *Pruner) once(ctx context.Context) {
	n, err := p.run.Once(ctx)
	args := []any{slog.Int("rows_removed", n)}
	for _, a := range p.run.Attrs {
		args = append(args, a)
	}
	log := p.logger.With(args...)
	switch {
	case err != nil && ctx.Err() != nil:
		// Shutting down: the interrupted batch rolled back, nothing to report.
	case err != nil:
		log.ErrorContext(ctx, p.lib+" prune failed; retrying at the next interval", slog.Any("error", err))
	case n > 0:
		log.InfoContext(ctx, p.lib+" pruned "+p.run.What)
	default:
		log.DebugContext(ctx, p.lib+" prune found nothing to remove")
	}
}
