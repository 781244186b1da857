package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// outage follows one thing the relay does against a dependency (publishing
// to Kafka, claiming in Postgres, heartbeating, …) through failures and
// recoveries, and logs them at a bounded rate: the first failure, then at
// most one line per interval with the count since the last line, and one
// line when it works again. A relay that logged every failed attempt of a
// minutes-long outage would bury the lines that matter. A dependency that
// flaps (fails, works, fails again within the interval) does not get a pair
// of lines per flap either: an outage that starts within the interval of
// the last line is logged only once it has lasted the interval, and its
// recovery only if it was logged.
type outage struct {
	what     string // "publishing to Kafka", "claiming rows", …
	logger   *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu        sync.Mutex
	since     time.Time // first failure of the current outage; zero while healthy
	failures  int       // since `since`
	unlogged  int       // failures since the last line
	logged    time.Time // when the last line about this was written
	announced bool      // the current outage has been logged
	lastErr   error
}

func newOutage(what string, logger *slog.Logger, interval time.Duration) *outage {
	return &outage{what: what, logger: logger, interval: interval, now: time.Now}
}

// fail records a failure and logs it if it starts an outage (unless a line
// was written within the interval) or the interval has passed since the
// last line.
func (o *outage) fail(ctx context.Context, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	o.lastErr = err
	o.failures++
	o.unlogged++
	quiet := !o.logged.IsZero() && now.Sub(o.logged) < o.interval
	if o.since.IsZero() {
		o.since, o.failures, o.unlogged, o.announced = now, 1, 1, false
		if !quiet {
			o.logger.WarnContext(ctx, "outbox relay: "+o.what+" failed; retrying with backoff",
				slog.Any("error", err))
			o.logged, o.unlogged, o.announced = now, 0, true
		}
		return
	}
	if quiet {
		return
	}
	o.logger.WarnContext(ctx, "outbox relay: "+o.what+" still failing; retrying with backoff",
		slog.Any("error", err), slog.Int("failures", o.unlogged),
		slog.Duration("down_for", now.Sub(o.since).Round(time.Millisecond)))
	o.logged, o.unlogged, o.announced = now, 0, true
}

// ok records a success, logging the recovery if the outage was logged.
func (o *outage) ok(ctx context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return
	}
	if o.announced {
		now := o.now()
		o.logger.InfoContext(ctx, "outbox relay: "+o.what+" works again",
			slog.Int("failures", o.failures), slog.Duration("down_for", now.Sub(o.since).Round(time.Millisecond)))
		o.logged = now
	}
	o.since, o.failures, o.unlogged, o.announced, o.lastErr = time.Time{}, 0, 0, false, nil
}

// state reports whether an outage is under way, since when and its last error.
func (o *outage) state() (down bool, since time.Time, lastErr error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero(), o.since, o.lastErr
}
