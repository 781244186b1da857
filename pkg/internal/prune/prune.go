// Package prune is the one background pruner of both libraries: a run at
// start and then every interval, each run's outcome logged once. What a run
// removes (processed inbox rows, published outbox rows) is the library's.
package prune

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/pkg/internal/periodic"
)

// DefaultInterval is the time between runs when a library's PrunerConfig
// leaves Interval zero.
const DefaultInterval = time.Hour

// Loop is a library's pruner: Run calls Once every Interval.
type Loop struct {
	// Lib prefixes messages and errors: "inbox" or "outbox".
	Lib string
	// What names the rows a run removes, for the log: "processed messages".
	What     string
	Interval time.Duration
	Logger   *slog.Logger
	// Attrs describe the configuration in each run's log line.
	Attrs []slog.Attr
	// Once runs one prune and returns how many rows it removed.
	Once func(ctx context.Context) (int, error)
}

// Defaults returns interval and logger with their defaults for zero values.
func Defaults(interval time.Duration, logger *slog.Logger) (time.Duration, *slog.Logger) {
	if interval == 0 {
		interval = DefaultInterval
	}
	if logger == nil {
		logger = slog.Default()
	}
	return interval, logger
}

// ValidateInterval refuses a negative interval, naming lib.
func ValidateInterval(lib string, interval time.Duration) error {
	if interval < 0 {
		return fmt.Errorf("%s: PrunerConfig.Interval is negative (%v); leave it zero for the default", lib, interval)
	}
	return nil
}

// Run prunes until ctx ends, then returns nil. A failed run is logged and
// retried at the next interval; it does not stop the pruner.
func (l Loop) Run(ctx context.Context) error {
	periodic.Run(ctx, l.Interval, l.once)
	return nil
}

func (l Loop) once(ctx context.Context) {
	n, err := l.Once(ctx)
	args := []any{slog.Int("rows_removed", n)}
	for _, a := range l.Attrs {
		args = append(args, a)
	}
	log := l.Logger.With(args...)
	switch {
	case err != nil && ctx.Err() != nil:
		// Shutting down: the interrupted batch rolled back, nothing to report.
	case err != nil:
		log.ErrorContext(ctx, l.Lib+" prune failed; retrying at the next interval", slog.Any("error", err))
	case n > 0:
		log.InfoContext(ctx, l.Lib+" pruned "+l.What)
	default:
		log.DebugContext(ctx, l.Lib+" prune found nothing to remove")
	}
}
